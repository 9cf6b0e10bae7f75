// Compute cost per op: GEMMs with tile and wave quantisation and a shape-bucketed efficiency, attention
// (fused or unfused), memory-bound kernels by bytes, and a launch per kernel (see cost_models.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "zeroplan/sim/cost_models.h"

#include <fmt/format.h>

#include "zeroplan/sim/errors.h"

namespace zeroplan::sim {

ComputeParts& ComputeParts::operator+=(const ComputeParts& o) {
  gemm_s += o.gemm_s;
  attention_s += o.attention_s;
  memory_s += o.memory_s;
  launch_s += o.launch_s;
  kernels += o.kernels;
  return *this;
}

namespace {

double peak(const DeviceSpec& d, std::string_view dtype) {
  if (auto it = d.peak_flops.find(std::string(dtype)); it != d.peak_flops.end()) return it->second;
  return d.peak_flops.at("fp32");
}

double achieved_bw(const DeviceSpec& d) {
  return d.mem_bw_achieved_bytes_per_s > 0 ? d.mem_bw_achieved_bytes_per_s : d.mem_bw_bytes_per_s;
}

// What memory-bound kernels achieve in a training step: the microbenchmark's bandwidth, calibrated.
double kernel_bw(const ClusterProfile& c) { return achieved_bw(c.device) * c.calibration.memory_bw_scale; }

// The calibrated GEMM efficiency (Calibration): the bucket's, scaled, with the thin-shape term, at most 1.
double calibrated_gemm_efficiency(const ClusterProfile& c, std::string_view dtype, double m, double n, double k) {
  const Calibration& cal = c.calibration;
  const double dim = std::min({m, n, k});
  const double shape = cal.gemm_half_dim > 0 ? dim / (dim + cal.gemm_half_dim) : 1.0;
  return std::min(1.0, gemm_efficiency(c.device, dtype, m, n, k) * cal.gemm_efficiency_scale * shape);
}

constexpr double kHuge = std::numeric_limits<double>::infinity();

}  // namespace

namespace {

// The index of the last bucket an (m, n, k) GEMM matches (0 when none does). REQUIRES: buckets non-empty.
std::size_t gemm_bucket(const std::vector<GemmBucket>& buckets, double m, double n, double k) {
  std::size_t at = 0;
  for (std::size_t i = 0; i < buckets.size(); ++i)
    if (m >= static_cast<double>(buckets[i].m_min) && n >= static_cast<double>(buckets[i].n_min) &&
        k >= static_cast<double>(buckets[i].k_min))
      at = i;
  return at;
}

}  // namespace

double gemm_efficiency(const DeviceSpec& device, std::string_view dtype, double m, double n, double k) {
  const auto it = device.gemm.efficiency.find(std::string(dtype));
  if (it == device.gemm.efficiency.end() || it->second.empty()) return device.compute_efficiency;
  return it->second[gemm_bucket(it->second, m, n, k)].efficiency;
}

double gemm_time(const ClusterProfile& cluster, std::string_view dtype, double m, double n, double k, double batch) {
  const DeviceSpec& d = cluster.device;
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0;
  const double rate = peak(d, dtype) * calibrated_gemm_efficiency(cluster, dtype, m, n, k);
  double math = 0;
  const GemmSpec& g = d.gemm;
  if (g.sm_count > 0 && g.tile_m > 0 && g.tile_n > 0) {
    // A matrix smaller than the tile gets a smaller tile (cuBLAS has them): the tile shrinks to the
    // matrix rounded up to 16 rows or columns.
    const auto round16 = [](double x) { return 16 * std::ceil(x / 16); };
    const double tm = std::min(static_cast<double>(g.tile_m), round16(m));
    const double tn = std::min(static_cast<double>(g.tile_n), round16(n));
    const double tiles = batch * std::ceil(m / tm) * std::ceil(n / tn);
    const double waves = std::ceil(tiles / g.sm_count);
    math = 2 * waves * g.sm_count * tm * tn * k / rate;
  } else {
    math = 2 * batch * m * n * k / rate;
  }
  const double e = dtype_bytes(dtype);
  const double mem = e * batch * (m * k + k * n + m * n) / kernel_bw(cluster);
  return std::max(math, mem);
}

std::vector<GemmBucket> fit_gemm_buckets(const ClusterProfile& cluster, std::string_view dtype,
                                         std::vector<GemmBucket> buckets, const std::vector<GemmPoint>& points) {
  if (buckets.empty()) throw SimError("fit_gemm_buckets: no buckets to fit");
  // The model at efficiency 1 and unbounded memory bandwidth: the compute-bound time.
  ClusterProfile at_one = cluster;
  at_one.calibration = Calibration{};  // the kernels alone, as the sweep measured them
  at_one.device.mem_bw_achieved_bytes_per_s = at_one.device.mem_bw_bytes_per_s = 1e30;
  std::vector<GemmBucket>& ones = at_one.device.gemm.efficiency[std::string(dtype)];
  ones = buckets;
  for (GemmBucket& b : ones) b.efficiency = 1;
  std::vector<double> log_sum(buckets.size(), 0.0);
  std::vector<int> count(buckets.size(), 0);
  for (const GemmPoint& p : points) {
    if (!(p.m > 0 && p.n > 0 && p.k > 0 && p.flops_per_s > 0))
      throw SimError(fmt::format("fit_gemm_buckets: GEMM {} x {} x {} at {} FLOP/s is not positive", p.m, p.n, p.k,
                                 p.flops_per_s));
    const std::size_t b = gemm_bucket(buckets, p.m, p.n, p.k);
    const double measured_s = 2 * p.m * p.n * p.k / p.flops_per_s;
    log_sum[b] += std::log(gemm_time(at_one, dtype, p.m, p.n, p.k) / measured_s);
    count[b] += 1;
  }
  for (std::size_t i = 0; i < buckets.size(); ++i)
    if (count[i] > 0) buckets[i].efficiency = std::min(1.0, std::exp(log_sum[i] / count[i]));
  return buckets;
}

ComputeParts op_time(const ClusterProfile& cluster, const UnitOp& op, double batch_scale, std::string_view dtype,
                     bool backward) {
  const DeviceSpec& d = cluster.device;
  const double e = dtype_bytes(dtype);
  const double bw = kernel_bw(cluster);
  ComputeParts p;
  if (op.kind == "gemm") {
    const double m = static_cast<double>(op.m) * batch_scale, n = static_cast<double>(op.n);
    const double k = static_cast<double>(op.k), b = static_cast<double>(op.batch);
    if (!backward) {
      p.gemm_s = gemm_time(cluster, dtype, m, n, k, b);
      p.kernels = 1;
    } else {
      p.gemm_s = gemm_time(cluster, dtype, m, k, n, b) + gemm_time(cluster, dtype, k, n, m, b);
      p.kernels = 2;
      if (op.bias) {
        p.memory_s = e * b * m * n / bw;
        p.kernels += 1;
      }
    }
  } else if (op.kind == "attention") {
    const double m = static_cast<double>(op.m), n = static_cast<double>(op.n), k = static_cast<double>(op.k);
    const double b = static_cast<double>(op.batch) * batch_scale;
    if (op.fused) {
      const double flops = 4 * b * m * n * k * (op.causal ? 0.5 : 1.0);
      const double bytes = e * b * (2 * m * k + 2 * n * k);
      const double largest = gemm_efficiency(d, dtype, kHuge, kHuge, kHuge);
      const double scale = cluster.calibration.attention_efficiency_scale;
      const double eff_f =
          std::min(1.0, scale * (d.attention.fused_fwd_efficiency > 0 ? d.attention.fused_fwd_efficiency : largest));
      const double eff_b =
          std::min(1.0, scale * (d.attention.fused_bwd_efficiency > 0 ? d.attention.fused_bwd_efficiency : largest));
      if (!backward) {
        p.attention_s = std::max(flops / (peak(d, dtype) * eff_f), bytes / bw);
        p.kernels = 1;
      } else {
        p.attention_s = std::max(2.5 * flops / (peak(d, dtype) * eff_b), 2 * bytes / bw);
        p.kernels = 2;
      }
    } else {
      const double scores = b * m * n;
      const double dropout = op.dropout ? (2 * e + 1) * scores / bw : 0.0;
      if (!backward) {
        p.attention_s = gemm_time(cluster, dtype, m, n, k, b) + gemm_time(cluster, dtype, m, k, n, b) +
                        2 * e * scores / bw + dropout;
        p.kernels = 3 + (op.dropout ? 1 : 0);
      } else {
        p.attention_s = gemm_time(cluster, dtype, m, k, n, b) + gemm_time(cluster, dtype, k, n, m, b) +
                        gemm_time(cluster, dtype, m, n, k, b) + gemm_time(cluster, dtype, n, k, m, b) +
                        3 * e * scores / bw + dropout;
        p.kernels = 5 + (op.dropout ? 1 : 0);
      }
    }
  } else {  // memory
    const double elems = backward ? op.elems_bwd : op.elems_fwd;
    const double bytes = backward ? op.bytes_bwd : op.bytes_fwd;
    p.memory_s = (e * elems + bytes) * batch_scale / bw;
    p.kernels = backward ? op.kernels_bwd : op.kernels_fwd;
  }
  p.launch_s = p.kernels * (d.launch_overhead_s + cluster.calibration.kernel_gap_s);
  return p;
}

}  // namespace zeroplan::sim
