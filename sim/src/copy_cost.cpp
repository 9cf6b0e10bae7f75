// Copy cost: host <-> device transfers at the measured bandwidth of their direction and memory kind.
#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim {

double copy_time(const ClusterProfile& c, CopyDir dir, double bytes, bool pinned) {
  if (bytes <= 0) return 0.0;
  const HostSpec& h = c.host;
  const double bw = dir == CopyDir::h2d ? (pinned ? h.bw_h2d_pinned_bytes_per_s : h.bw_h2d_pageable_bytes_per_s)
                                        : (pinned ? h.bw_d2h_pinned_bytes_per_s : h.bw_d2h_pageable_bytes_per_s);
  return bytes / bw + c.links.pcie.latency_s;
}

}  // namespace zeroplan::sim
