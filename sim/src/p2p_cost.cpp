// Point-to-point cost: one send between two ranks (pipeline activations and their gradients).
#include <algorithm>

#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim {

double p2p_time(const ClusterProfile& c, double bytes, bool same_node) {
  if (bytes <= 0) return 0.0;
  const Link& l = same_node ? c.links.intra_node : c.links.inter_node;
  // The inter-node bandwidth is per node: its devices send at once (every pipeline's stage boundary
  // crosses the same pair of nodes), so each gets its share, as in collective_time's inter-node phase.
  const double bw = same_node ? l.bw_bytes_per_s : l.bw_bytes_per_s / std::max(1, c.devices_per_node);
  return (l.latency_s + bytes / bw) * c.calibration.comm_time_scale;
}

}  // namespace zeroplan::sim
