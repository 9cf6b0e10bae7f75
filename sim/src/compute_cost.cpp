// Compute cost: measured unit times when the profile fits the target, else the sum over the unit's ops
// (op_cost.cpp), else a roofline.
#include <fmt/format.h>

#include <algorithm>
#include <cassert>

#include "zeroplan/sim/cost_models.h"
#include "zeroplan/sim/errors.h"

namespace zeroplan::sim {

int dtype_bytes(std::string_view dtype) {
  if (dtype == "fp32") return 4;
  if (dtype == "fp16" || dtype == "bf16") return 2;
  assert(false && "unknown dtype");
  return 4;
}

int param_tensors(const UnitProfile& unit) {
  if (unit.params == 0) return 0;
  if (unit.type == "TransformerBlock") return 12;
  if (unit.type == "Attention" || unit.type == "MLP") return 6;  // a block's halves: LayerNorm + 2 linears
  if (unit.type == "ResNetStage") return 30;
  if (unit.type == "Embedding") return 2;
  return 2;  // weight and bias
}

bool measured_on_device_kind(const ModelProfile& model, const ClusterProfile& cluster) {
  if (!model.measured) return false;
  const bool profile_cpu = model.device.rfind("cpu", 0) == 0;
  return profile_cpu == (cluster.device.kind == "cpu");
}

double compute_time_factor(const ModelProfile& model, const ClusterProfile& cluster) {
  const double ranks = model.concurrent_ranks > 1 ? 1.0 : cluster.core_contention.compute_ranks_slowdown;
  return cluster.calibration.compute_time_scale * ranks;
}

namespace {
double peak_flops(const ClusterProfile& cluster, std::string_view dtype) {
  const auto& p = cluster.device.peak_flops;
  if (auto it = p.find(std::string(dtype)); it != p.end()) return it->second;
  return p.at("fp32");  // fp32 is required by the schema
}
}  // namespace

ComputeTime unit_compute_time(const ModelProfile& model, int unit_index, const ClusterProfile& cluster,
                              double micro_batch, std::string_view compute_dtype) {
  const UnitProfile& u = model.units.at(static_cast<std::size_t>(unit_index));
  const double ref = model.batch;
  ComputeTime t;
  const double fwd = u.time_fwd_s.at(micro_batch, ref);
  const double bwd = u.time_bwd_s.at(micro_batch, ref);
  if (measured_on_device_kind(model, cluster) && fwd + bwd > 0) {
    // Measured at the plan's dtype too: those times, not a ratio of GEMM peaks.
    if (model.dtype != compute_dtype) {
      if (auto it = u.times_at_dtype.find(std::string(compute_dtype)); it != u.times_at_dtype.end()) {
        t.fwd_s = std::max(0.0, it->second.time_fwd_s.at(micro_batch, ref));
        t.bwd_s = std::max(0.0, it->second.time_bwd_s.at(micro_batch, ref));
        t.from_profile = true;
        return t;
      }
    }
    double scale = 1.0;
    if (model.dtype != compute_dtype) scale = peak_flops(cluster, model.dtype) / peak_flops(cluster, compute_dtype);
    t.fwd_s = std::max(0.0, fwd) * scale;
    t.bwd_s = std::max(0.0, bwd) * scale;
    t.from_profile = true;
    return t;
  }
  if (!u.ops.empty()) {
    const double scale = micro_batch / ref;
    for (const UnitOp& op : u.ops) {
      t.fwd_parts += op_time(cluster, op, scale, compute_dtype, false);
      t.bwd_parts += op_time(cluster, op, scale, compute_dtype, true);
    }
    t.fwd_s = t.fwd_parts.total_s();
    t.bwd_s = t.bwd_parts.total_s();
    t.from_ops = true;
    return t;
  }
  // A Python model's glue (the model's own code outside its units, zeroplan/_profile.py): measured on
  // another device kind, with nothing to scale it by; left out rather than charged at that device's speed.
  if (u.type == "Glue") return t;
  const double flops_f = u.flops_fwd.at(micro_batch, ref);
  double flops_b = u.flops_bwd.at(micro_batch, ref);
  if (flops_f <= 0 && flops_b <= 0) {
    if (fwd + bwd > 0) {  // measured elsewhere and nothing to scale by: use as is
      t.fwd_s = fwd;
      t.bwd_s = bwd;
      t.from_profile = true;
      return t;
    }
    if (u.params == 0 && u.bytes_saved.at(micro_batch, ref) <= 0) return t;  // a free unit (reshape, dropout)
    // An embedding lookup does no arithmetic: it is a gather, timed by the bytes it moves (below).
    if (u.type != "Embedding")
      throw SimError(fmt::format("simulate: unit {} \"{}\" has no time and no flops", unit_index, u.name));
  }
  if (flops_b <= 0) flops_b = 2 * flops_f;  // 0 for a gather: its time is the memory side of the roof
  const auto& d = cluster.device;
  const double flops_per_s = peak_flops(cluster, compute_dtype) * d.compute_efficiency;
  const double act_bytes = u.bytes_output.at(micro_batch, ref) + u.bytes_saved.at(micro_batch, ref);
  const double param_bytes = static_cast<double>(u.params) * dtype_bytes(compute_dtype);
  const double bytes_f = param_bytes + act_bytes;
  const int kernels = std::max(1, param_tensors(u));
  auto roof = [&](double flops, double bytes) {
    const double mem = d.mem_bw_bytes_per_s > 0 ? bytes / d.mem_bw_bytes_per_s : 0.0;
    return std::max(flops / flops_per_s, mem);
  };
  t.fwd_s = roof(flops_f, bytes_f) + kernels * d.launch_overhead_s;
  t.bwd_s = roof(flops_b, 2 * bytes_f) + 2 * kernels * d.launch_overhead_s;
  return t;
}

}  // namespace zeroplan::sim
