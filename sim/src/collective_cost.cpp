// Collective cost: alpha-beta per op and algorithm, fitted when the cluster has a fit, else derived from
// the links, hierarchical across nodes.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <vector>

#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim {

std::string_view to_string(CollOp op) {
  switch (op) {
    case CollOp::all_reduce: return "all_reduce";
    case CollOp::all_gather: return "all_gather";
    case CollOp::reduce_scatter: return "reduce_scatter";
    case CollOp::broadcast: return "broadcast";
    case CollOp::reduce: return "reduce";
  }
  return "?";
}

double bus_factor(CollOp op, int n) {
  switch (op) {
    case CollOp::all_reduce: return 2.0 * (n - 1) / n;
    case CollOp::all_gather:
    case CollOp::reduce_scatter: return static_cast<double>(n - 1) / n;
    case CollOp::broadcast:
    case CollOp::reduce: return 1.0;
  }
  return 1.0;
}

namespace {

double ring_time(CollOp op, double s, int n, double bw, double alpha) {
  switch (op) {
    case CollOp::all_reduce: return 2.0 * (n - 1) / n * s / bw + 2.0 * (n - 1) * alpha;
    case CollOp::all_gather:
    case CollOp::reduce_scatter: return static_cast<double>(n - 1) / n * s / bw + (n - 1) * alpha;
    case CollOp::broadcast:
    case CollOp::reduce: return s / bw + (n - 1) * alpha;
  }
  return 0;
}

double tree_time(CollOp op, double s, int n, double bw, double alpha) {
  const double depth = std::ceil(std::log2(static_cast<double>(n)));
  switch (op) {
    case CollOp::all_reduce: return 2.0 * s / bw + 2.0 * depth * alpha;
    case CollOp::broadcast:
    case CollOp::reduce: return s / bw + depth * alpha;
    case CollOp::all_gather:
    case CollOp::reduce_scatter: return ring_time(op, s, n, bw, alpha);
  }
  return 0;
}

// A fit's time for `bytes`: its measured points interpolated piecewise linearly when it has two or more
// (below the smallest: the smallest's time; beyond the largest: the last segment's slope), else
// alpha + beta x bytes.
double fit_time(const CollectiveFit& f, double bytes) {
  const auto& p = f.points;
  if (p.size() < 2) return f.alpha_s + f.beta_s_per_byte * bytes;
  if (bytes <= p.front().first) return p.front().second;
  std::size_t k = 1;
  while (k + 1 < p.size() && bytes > p[k].first) ++k;
  const auto& [x0, t0] = p[k - 1];
  const auto& [x1, t1] = p[k];
  const double slope = std::max(0.0, (t1 - t0) / (x1 - x0));
  return std::max(t0, t0 + slope * (bytes - x0));
}

// The fits that apply to (op, backend, scope, ranks, algo, dtype): a fit measured with the dtype wins
// over one for any dtype ("", measured in fp32).
std::vector<const CollectiveFit*> applicable_fits(const ClusterProfile& c, CollOp op, std::string_view backend,
                                                  std::string_view scope, int ranks, CollAlgo algo, std::string_view dtype) {
  auto applies = [&](const CollectiveFit& f) {
    if (f.op != to_string(op) || f.backend != backend || f.scope != scope) return false;
    if (algo == CollAlgo::ring && f.algorithm != "ring") return false;
    if (algo == CollAlgo::tree && f.algorithm != "tree") return false;
    return std::find(f.world_sizes.begin(), f.world_sizes.end(), ranks) != f.world_sizes.end();
  };
  const bool own = std::any_of(c.collectives.begin(), c.collectives.end(),
                               [&](const CollectiveFit& f) { return applies(f) && f.dtype == dtype; });
  std::vector<const CollectiveFit*> out;
  for (const CollectiveFit& f : c.collectives) {
    if (!applies(f)) continue;
    if (own ? f.dtype != dtype : !(f.dtype.empty() || f.dtype == "fp32")) continue;
    out.push_back(&f);
  }
  return out;
}

// Fitted time for (op, backend, scope, ranks, dtype), or a negative number when no fit applies.
double fitted_time(const ClusterProfile& c, CollOp op, std::string_view backend, std::string_view scope,
                   double bytes, int ranks, CollAlgo algo, std::string_view dtype) {
  double best = std::numeric_limits<double>::infinity();
  for (const CollectiveFit* f : applicable_fits(c, op, backend, scope, ranks, algo, dtype)) best = std::min(best, fit_time(*f, bytes));
  return std::isfinite(best) ? best : -1.0;
}

// inf over bytes > 0 of fit_time(f, bytes) / bytes, or a negative number when the fit has a negative time
// or bytes (no bound claimed). fit_time is linear between its points (and beyond the last), so the
// ratio is monotone on each piece: its infimum is at a piece's end, or the last slope far beyond.
double least_time_per_byte(const CollectiveFit& f) {
  const auto& p = f.points;
  if (p.size() < 2) return f.alpha_s >= 0 && f.beta_s_per_byte >= 0 ? f.beta_s_per_byte : -1.0;
  for (std::size_t k = 0; k < p.size(); ++k)
    if (!(p[k].first > 0 && p[k].second >= 0) || (k > 0 && !(p[k].first > p[k - 1].first))) return -1.0;
  double least = p.front().second / p.front().first;  // up to the first point: its time
  for (std::size_t k = 1; k < p.size(); ++k) {
    const auto& [x0, t0] = p[k - 1];
    const auto& [x1, t1] = p[k];
    const double slope = std::max(0.0, (t1 - t0) / (x1 - x0));
    least = std::min({least, t0 / x0, (t0 + slope * (x1 - x0)) / x1});
    if (k + 1 == p.size()) least = std::min(least, slope);  // the last piece goes on at its slope
  }
  return least;
}

}  // namespace

double collective_time_flat(CollOp op, double bytes, int n, double bw, double alpha, CollAlgo algo) {
  assert(n >= 1 && bw > 0);
  if (n <= 1) return 0.0;
  switch (algo) {
    case CollAlgo::ring: return ring_time(op, bytes, n, bw, alpha);
    case CollAlgo::tree: return tree_time(op, bytes, n, bw, alpha);
    case CollAlgo::best: return std::min(ring_time(op, bytes, n, bw, alpha), tree_time(op, bytes, n, bw, alpha));
  }
  return 0.0;
}

std::string_view default_backend(const ClusterProfile& c) {
  if (c.device.kind != "cpu") return "nccl";
  for (const CollectiveFit& f : c.collectives)
    if (f.backend == "shm") return "shm";
  return "gloo";
}

// Gloo's reduce-scatter is a ring over send/recv holding a received chunk (two beyond 2 ranks); NCCL's and
// the shared-memory one's hold nothing beyond their output.
std::int64_t reduce_scatter_temp_bytes(const ClusterProfile& c, std::int64_t bytes, int ranks) {
  if (default_backend(c) != "gloo" || ranks <= 1) return 0;
  return bytes / ranks * (ranks > 2 ? 2 : 1);
}

namespace {
double uncalibrated_collective_time(const ClusterProfile& c, CollOp op, double bytes, int ranks, const CollectiveOptions& o);
}  // namespace

double collective_time(const ClusterProfile& c, CollOp op, double bytes, int ranks, const CollectiveOptions& o) {
  return uncalibrated_collective_time(c, op, bytes, ranks, o) * c.calibration.comm_time_scale;
}

namespace {
double uncalibrated_collective_time(const ClusterProfile& c, CollOp op, double bytes, int ranks, const CollectiveOptions& o) {
  if (ranks <= 1 || bytes <= 0) return 0.0;
  const std::string_view backend = o.backend.empty() ? default_backend(c) : std::string_view(o.backend);
  const int d = std::max(1, c.devices_per_node);
  const bool intra = ranks <= d;
  if (const double t = fitted_time(c, op, backend, intra ? "intra_node" : "inter_node", bytes, ranks, o.algo, o.dtype);
      t >= 0) {
    return t;
  }
  const Link& li = c.links.intra_node;
  if (intra) return collective_time_flat(op, bytes, ranks, li.bw_bytes_per_s, li.latency_s, o.algo);
  const int m = (ranks + d - 1) / d;  // nodes
  const Link& le = c.links.inter_node;
  auto intra_t = [&](CollOp x, double s) { return collective_time_flat(x, s, d, li.bw_bytes_per_s, li.latency_s, o.algo); };
  // The d devices of a node run d parallel inter-node rings on 1/d of the data, sharing the node's link:
  // the same time as one ring of the full data at the node's bandwidth.
  auto inter_t = [&](CollOp x, double s) { return collective_time_flat(x, s, m, le.bw_bytes_per_s, le.latency_s, o.algo); };
  switch (op) {
    case CollOp::all_reduce:
      return intra_t(CollOp::reduce_scatter, bytes) + inter_t(CollOp::all_reduce, bytes) +
             intra_t(CollOp::all_gather, bytes);
    case CollOp::all_gather:
    case CollOp::reduce_scatter:
    case CollOp::broadcast:
    case CollOp::reduce: return inter_t(op, bytes) + intra_t(op, bytes);
  }
  return 0.0;
}
}  // namespace

double collective_time_lower_bound(const ClusterProfile& c, CollOp op, double bytes, int ranks, std::string_view dtype) {
  if (ranks <= 1 || bytes <= 0) return 0.0;
  const std::string_view backend = default_backend(c);
  const std::string_view scope = ranks <= std::max(1, c.devices_per_node) ? "intra_node" : "inter_node";
  double least = std::numeric_limits<double>::infinity();
  for (const CollAlgo algo : {CollAlgo::ring, CollAlgo::tree, CollAlgo::best}) {
    CollectiveOptions o;
    o.algo = algo;
    o.dtype = std::string(dtype);
    const std::vector<const CollectiveFit*> fits = applicable_fits(c, op, backend, scope, ranks, algo, o.dtype);
    if (fits.empty()) {
      // From the links: alpha-beta terms with latencies >= 0 (and their minimum for `best`), concave in the
      // bytes and 0 at none: one collective of the total is the cheapest split.
      least = std::min(least, collective_time(c, op, bytes, ranks, o));
      continue;
    }
    double per_byte = std::numeric_limits<double>::infinity();
    for (const CollectiveFit* f : fits) per_byte = std::min(per_byte, least_time_per_byte(*f));
    if (!(per_byte > 0)) return 0.0;  // a negative time or a free byte somewhere: no bound claimed
    least = std::min(least, bytes * per_byte * c.calibration.comm_time_scale);
  }
  return std::isfinite(least) ? std::max(0.0, least) : 0.0;
}

}  // namespace zeroplan::sim
