// ClusterProfile's rules: each field's range, what the collectives and links must say, and a provenance
// for every number.
#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "cluster_internal.h"
#include "zeroplan/profiles/cluster.h"

namespace zeroplan {
namespace {

using detail::cluster_error;

bool cluster_one_of(const std::string& v, std::initializer_list<const char*> allowed) {
  return std::any_of(allowed.begin(), allowed.end(), [&](const char* a) { return v == a; });
}

std::string cluster_list_of(std::initializer_list<const char*> allowed) {
  std::string s;
  for (const char* a : allowed) s += (s.empty() ? "" : ", ") + quote_json(a);
  return s;
}

void cluster_enum(const std::string& field, const std::string& v, std::initializer_list<const char*> allowed) {
  if (!cluster_one_of(v, allowed)) cluster_error(field + " must be one of " + cluster_list_of(allowed) + " (got " + quote_json(v) + ")");
}

void cluster_positive(const std::string& field, double v) {
  if (!(v > 0)) cluster_error(field + " must be > 0 (got " + num(v) + ")");
}
void cluster_positive(const std::string& field, std::int64_t v) {
  if (v <= 0) cluster_error(field + " must be > 0 (got " + num(v) + ")");
}
void cluster_non_negative(const std::string& field, double v) {
  if (!(v >= 0)) cluster_error(field + " must be >= 0 (got " + num(v) + ")");
}


// Names and counts: ranks are counted in an int, so a cluster past 2^24 devices is refused, not wrapped.
void validate_size(const ClusterProfile& c) {
  if (c.name.empty()) cluster_error("name is empty");
  if (c.nodes < 1) cluster_error("nodes must be >= 1 (got " + num(c.nodes) + ")");
  if (c.devices_per_node < 1) cluster_error("devices_per_node must be >= 1 (got " + num(c.devices_per_node) + ")");
  // Ranks are counted in an int: a cluster past 2^24 devices (nodes x devices_per_node) is refused, not wrapped.
  if (c.nodes > 999999) cluster_error("nodes must be at most 999999 (got " + num(c.nodes) + ")");
  if (c.devices_per_node > 4096) cluster_error("devices_per_node must be at most 4096 (got " + num(c.devices_per_node) + ")");
  if (static_cast<std::int64_t>(c.nodes) * c.devices_per_node > (std::int64_t{1} << 24))
    cluster_error("nodes " + num(c.nodes) + " x devices_per_node " + num(c.devices_per_node) + " = " +
                  num(static_cast<std::int64_t>(c.nodes) * c.devices_per_node) + " devices, more than 2^24 (16,777,216)");
}

// The device: kind, memory, peak FLOPs per dtype, the GEMM and attention efficiencies.
void validate_device(const ClusterProfile& c) {
  const DeviceSpec& d = c.device;
  if (d.name.empty()) cluster_error("device.name is empty");
  cluster_enum("device.kind", d.kind, {"cuda", "cpu"});
  cluster_positive("device.mem_bytes", d.mem_bytes);
  if (!d.peak_flops.count("fp32")) cluster_error("device.peak_flops has no \"fp32\" entry");
  for (const auto& [dtype, flops] : d.peak_flops) {
    cluster_enum("device.peak_flops key", dtype, {"fp32", "tf32", "fp16", "bf16"});
    cluster_positive("device.peak_flops." + dtype, flops);
  }
  cluster_positive("device.mem_bw_bytes_per_s", d.mem_bw_bytes_per_s);
  cluster_non_negative("device.launch_overhead_s", d.launch_overhead_s);
  if (!(d.compute_efficiency > 0 && d.compute_efficiency <= 1))
    cluster_error("device.compute_efficiency must be in (0, 1] (got " + num(d.compute_efficiency) + ")");
  if (!(d.mem_bw_achieved_bytes_per_s >= 0 && d.mem_bw_achieved_bytes_per_s <= d.mem_bw_bytes_per_s))
    cluster_error("device.mem_bw_achieved_bytes_per_s must be in [0, mem_bw_bytes_per_s " + num(d.mem_bw_bytes_per_s) +
                  "] (got " + num(d.mem_bw_achieved_bytes_per_s) + ")");
  if (d.gemm.sm_count < 0 || d.gemm.tile_m < 0 || d.gemm.tile_n < 0 ||
      ((d.gemm.sm_count > 0) != (d.gemm.tile_m > 0)) || ((d.gemm.tile_m > 0) != (d.gemm.tile_n > 0)))
    cluster_error("device.gemm: sm_count, tile_m and tile_n must all be > 0 or all 0 (got " + num(d.gemm.sm_count) + ", " +
                  num(d.gemm.tile_m) + ", " + num(d.gemm.tile_n) + ")");
  for (const auto& [dtype, rows] : d.gemm.efficiency) {
    const std::string at = "device.gemm.efficiency." + dtype;
    cluster_enum("device.gemm.efficiency key", dtype, {"fp32", "tf32", "fp16", "bf16"});
    if (rows.empty() || rows[0].m_min != 0 || rows[0].n_min != 0 || rows[0].k_min != 0)
      cluster_error(at + " must start with a row whose m_min, n_min and k_min are 0");
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const GemmBucket& b = rows[i];
      const std::string row = at + "[" + std::to_string(i) + "]";
      if (b.m_min < 0 || b.n_min < 0 || b.k_min < 0)
        cluster_error(row + ": m_min, n_min and k_min must be >= 0 (got " + num(b.m_min) + ", " + num(b.n_min) + ", " +
                      num(b.k_min) + ")");
      if (!(b.efficiency > 0 && b.efficiency <= 1))
        cluster_error(row + ".efficiency must be in (0, 1] (got " + num(b.efficiency) + ")");
    }
  }
  if (!(d.attention.fused_fwd_efficiency >= 0 && d.attention.fused_fwd_efficiency <= 1))
    cluster_error("device.attention.fused_fwd_efficiency must be in [0, 1] (got " + num(d.attention.fused_fwd_efficiency) + ")");
  if (!(d.attention.fused_bwd_efficiency >= 0 && d.attention.fused_bwd_efficiency <= 1))
    cluster_error("device.attention.fused_bwd_efficiency must be in [0, 1] (got " + num(d.attention.fused_bwd_efficiency) + ")");
}

// The host (memory, cores, copy bandwidths, optimizer throughput) and the three links.
void validate_host_and_links(const ClusterProfile& c) {
  const HostSpec& h = c.host;
  cluster_positive("host.mem_bytes", h.mem_bytes);
  if (h.cores < 1) cluster_error("host.cores must be >= 1 (got " + num(h.cores) + ")");
  cluster_positive("host.bw_h2d_pinned_bytes_per_s", h.bw_h2d_pinned_bytes_per_s);
  cluster_positive("host.bw_h2d_pageable_bytes_per_s", h.bw_h2d_pageable_bytes_per_s);
  cluster_positive("host.bw_d2h_pinned_bytes_per_s", h.bw_d2h_pinned_bytes_per_s);
  cluster_positive("host.bw_d2h_pageable_bytes_per_s", h.bw_d2h_pageable_bytes_per_s);
  cluster_positive("host.memcpy_bw_bytes_per_s", h.memcpy_bw_bytes_per_s);
  cluster_positive("host.optimizer.adam.per_tensor_params_per_s", h.optimizer.adam.per_tensor_params_per_s);
  cluster_positive("host.optimizer.adam.flat_params_per_s", h.optimizer.adam.flat_params_per_s);
  cluster_positive("host.optimizer.sgd.per_tensor_params_per_s", h.optimizer.sgd.per_tensor_params_per_s);
  cluster_positive("host.optimizer.sgd.flat_params_per_s", h.optimizer.sgd.flat_params_per_s);

  for (const auto& [field, link] : {std::pair{"links.intra_node", &c.links.intra_node},
                                    std::pair{"links.inter_node", &c.links.inter_node},
                                    std::pair{"links.pcie", &c.links.pcie}}) {
    if (link->name.empty()) cluster_error(std::string(field) + ".name is empty");
    cluster_positive(std::string(field) + ".bw_bytes_per_s", link->bw_bytes_per_s);
    cluster_non_negative(std::string(field) + ".latency_s", link->latency_s);
  }
}

// Each fitted collective: its kind, world sizes, alpha-beta terms and measured points.
void validate_collectives(const ClusterProfile& c) {
  for (std::size_t i = 0; i < c.collectives.size(); ++i) {
    const CollectiveFit& f = c.collectives[i];
    const std::string at = "collectives[" + std::to_string(i) + "]";
    cluster_enum(at + ".op", f.op, {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"});
    cluster_enum(at + ".backend", f.backend, {"nccl", "gloo", "shm"});
    cluster_enum(at + ".algorithm", f.algorithm, {"ring", "tree"});
    cluster_enum(at + ".scope", f.scope, {"intra_node", "inter_node"});
    if (!f.dtype.empty()) cluster_enum(at + ".dtype", f.dtype, {"fp32", "bf16", "fp16"});
    if (f.world_sizes.empty()) cluster_error(at + ".world_sizes is empty");
    for (int n : f.world_sizes)
      if (n < 2) cluster_error(at + ".world_sizes has " + num(n) + " (must be >= 2)");
    cluster_non_negative(at + ".alpha_s", f.alpha_s);
    cluster_non_negative(at + ".beta_s_per_byte", f.beta_s_per_byte);
    cluster_non_negative(at + ".fit_residual", f.fit_residual);
    if (f.min_bytes < 0) cluster_error(at + ".min_bytes must be >= 0 (got " + num(f.min_bytes) + ")");
    if (f.min_bytes > f.max_bytes)
      cluster_error(at + ".min_bytes " + num(f.min_bytes) + " > max_bytes " + num(f.max_bytes));
    for (std::size_t k = 0; k < f.points.size(); ++k) {
      const auto& [bytes, s] = f.points[k];
      const std::string pk = at + ".points[" + std::to_string(k) + "]";
      if (!(bytes > 0 && bytes <= 1e18)) cluster_error(pk + " bytes must be in (0, 1e18] (got " + num(bytes) + ")");
      if (!(s > 0 && s <= 1e6)) cluster_error(pk + " seconds must be in (0, 1e6] (got " + num(s) + ")");
      if (k > 0 && !(bytes > f.points[k - 1].first))
        cluster_error(pk + " bytes " + num(bytes) + " not above the previous point's " + num(f.points[k - 1].first));
    }
  }
}

// The allocator factor, the probe's load, the calibration terms and the core contention.
void validate_terms(const ClusterProfile& c) {
  if (!(c.allocator_overhead_factor >= 1 && c.allocator_overhead_factor <= 10))
    cluster_error("allocator_overhead_factor must be in [1, 10] (got " + num(c.allocator_overhead_factor) + ")");
  if (!(c.probe_other_load_cores >= 0 || c.probe_other_load_cores == -1))
    cluster_error("probe_other_load_cores must be >= 0, or -1 when unknown (got " + num(c.probe_other_load_cores) + ")");
  for (const CalibrationField& f : calibration_fields()) {
    const double v = c.calibration.*f.field;
    if (f.positive && !(v > 0)) cluster_error(fmt::format("calibration.{} must be > 0 (got {})", f.name, num(v)));
    if (!f.positive && !(v >= f.lo && v <= f.hi))
      cluster_error(fmt::format("calibration.{} must be in [{}, {}] (got {})", f.name, f.lo, f.hi, num(v)));
  }
  for (const auto& [field, v] : {std::pair{"compute_ranks_slowdown", c.core_contention.compute_ranks_slowdown},
                                 std::pair{"compute_with_comm_slowdown", c.core_contention.compute_with_comm_slowdown},
                                 std::pair{"comm_with_compute_slowdown", c.core_contention.comm_with_compute_slowdown}}) {
    if (!(v >= 1 && v <= 100))
      cluster_error(std::string("core_contention.") + field + " must be in [1, 100] (got " + num(v) + ")");
  }
}

// Provenance: known sources, every number covered, no entry naming a path that does not exist.
void validate_provenance(const ClusterProfile& c) {
  const ojson j = to_ordered_json(c);
  std::set<std::string> paths;
  detail::walk(j, "", [&](const std::string& path, const ojson&) {
    if (!path.empty() && !detail::outside_provenance(detail::top_key_of(path))) paths.insert(path);
  });
  for (const auto& [path, p] : c.provenance) {
    cluster_enum("provenance." + path + ".source", p.source, {"datasheet", "paper", "microbenchmark", "probe", "estimate", "calibration"});
    if (p.citation.empty()) cluster_error("provenance." + path + ".citation is empty");
    if (!paths.count(path)) {
      std::string message = "provenance names " + quote_json(path) + ", which is not a field";
      const std::string guess = closest_match(path, std::vector<std::string>(paths.begin(), paths.end()));
      if (!guess.empty()) message += " (did you mean " + quote_json(guess) + "?)";
      cluster_error(message);
    }
  }
  for (const std::string& path : detail::numeric_paths(j))
    if (!detail::covered(c.provenance, path)) cluster_error("no provenance for " + path);
}

}  // namespace

void validate(const ClusterProfile& c) {
  validate_size(c);
  validate_device(c);
  validate_host_and_links(c);
  validate_collectives(c);
  validate_terms(c);
  validate_provenance(c);
}

}  // namespace zeroplan
