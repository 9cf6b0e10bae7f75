#include "zeroplan/profiles/cluster.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

#include <fmt/format.h>

#include "cluster_internal.h"
#include "json_util.h"
#include "zeroplan/config.h"
#include "zeroplan/profiles/json_io.h"

namespace zeroplan {

const std::vector<CalibrationField>& calibration_fields() {
  static const std::vector<CalibrationField> fields = {
      {"compute_time_scale", &Calibration::compute_time_scale, 0, 0, true},
      {"comm_time_scale", &Calibration::comm_time_scale, 0, 0, true},
      {"gemm_efficiency_scale", &Calibration::gemm_efficiency_scale, 1e-3, 10, false},
      {"gemm_half_dim", &Calibration::gemm_half_dim, 0, 1e6, false},
      {"attention_efficiency_scale", &Calibration::attention_efficiency_scale, 1e-3, 10, false},
      {"memory_bw_scale", &Calibration::memory_bw_scale, 1e-3, 10, false},
      {"kernel_gap_s", &Calibration::kernel_gap_s, 0, 1, false},
      {"compute_with_comm_slowdown", &Calibration::compute_with_comm_slowdown, 1, 100, false},
  };
  return fields;
}

namespace {

using detail::cluster_error;
using detail::kClusterWhere;

ojson write_device(const DeviceSpec& d) {
  ojson j;
  j["name"] = d.name;
  j["kind"] = d.kind;
  j["mem_bytes"] = d.mem_bytes;
  j["peak_flops"] = d.peak_flops;
  j["mem_bw_bytes_per_s"] = d.mem_bw_bytes_per_s;
  j["launch_overhead_s"] = d.launch_overhead_s;
  j["compute_efficiency"] = d.compute_efficiency;
  if (d.mem_bw_achieved_bytes_per_s > 0) j["mem_bw_achieved_bytes_per_s"] = d.mem_bw_achieved_bytes_per_s;
  if (!d.gemm.empty()) {
    ojson g;
    g["sm_count"] = d.gemm.sm_count;
    g["tile_m"] = d.gemm.tile_m;
    g["tile_n"] = d.gemm.tile_n;
    ojson eff = ojson::object();
    for (const auto& [dtype, rows] : d.gemm.efficiency) {
      ojson a = ojson::array();
      for (const GemmBucket& b : rows)
        a.push_back(ojson{{"m_min", b.m_min}, {"n_min", b.n_min}, {"k_min", b.k_min}, {"efficiency", b.efficiency}});
      eff[dtype] = a;
    }
    g["efficiency"] = eff;
    j["gemm"] = g;
  }
  if (d.attention != AttentionSpec{}) {
    j["attention"] = ojson{{"fused_fwd_efficiency", d.attention.fused_fwd_efficiency},
                           {"fused_bwd_efficiency", d.attention.fused_bwd_efficiency}};
  }
  return j;
}

ojson write_rate(const OptimizerRate& r) {
  ojson j;
  j["per_tensor_params_per_s"] = r.per_tensor_params_per_s;
  j["flat_params_per_s"] = r.flat_params_per_s;
  return j;
}

ojson write_host(const HostSpec& h) {
  ojson j;
  j["mem_bytes"] = h.mem_bytes;
  j["cores"] = h.cores;
  j["bw_h2d_pinned_bytes_per_s"] = h.bw_h2d_pinned_bytes_per_s;
  j["bw_h2d_pageable_bytes_per_s"] = h.bw_h2d_pageable_bytes_per_s;
  j["bw_d2h_pinned_bytes_per_s"] = h.bw_d2h_pinned_bytes_per_s;
  j["bw_d2h_pageable_bytes_per_s"] = h.bw_d2h_pageable_bytes_per_s;
  j["memcpy_bw_bytes_per_s"] = h.memcpy_bw_bytes_per_s;
  ojson o;
  o["adam"] = write_rate(h.optimizer.adam);
  o["sgd"] = write_rate(h.optimizer.sgd);
  j["optimizer"] = o;
  return j;
}

ojson write_link(const Link& l) {
  ojson j;
  j["name"] = l.name;
  j["bw_bytes_per_s"] = l.bw_bytes_per_s;
  j["latency_s"] = l.latency_s;
  return j;
}

ojson write_collective(const CollectiveFit& c) {
  ojson j;
  j["op"] = c.op;
  j["backend"] = c.backend;
  j["algorithm"] = c.algorithm;
  j["scope"] = c.scope;
  if (!c.dtype.empty()) j["dtype"] = c.dtype;
  j["world_sizes"] = c.world_sizes;
  j["alpha_s"] = c.alpha_s;
  j["beta_s_per_byte"] = c.beta_s_per_byte;
  j["fit_residual"] = c.fit_residual;
  j["min_bytes"] = c.min_bytes;
  j["max_bytes"] = c.max_bytes;
  if (!c.points.empty()) {
    ojson pts = ojson::array();
    for (const auto& [bytes, s] : c.points) pts.push_back(ojson::array({bytes, s}));
    j["points"] = pts;
  }
  return j;
}

}  // namespace

void read_value(const nlohmann::json& j, GemmBucket& b, const std::string& path) {
  ObjectReader r(j, path);
  r.req("m_min", b.m_min);
  r.req("n_min", b.n_min);
  r.req("k_min", b.k_min);
  r.req("efficiency", b.efficiency);
  r.finish();
}

void read_value(const nlohmann::json& j, GemmSpec& g, const std::string& path) {
  ObjectReader r(j, path);
  r.opt("sm_count", g.sm_count);
  r.opt("tile_m", g.tile_m);
  r.opt("tile_n", g.tile_n);
  r.opt("efficiency", g.efficiency);
  r.finish();
}

void read_value(const nlohmann::json& j, AttentionSpec& a, const std::string& path) {
  ObjectReader r(j, path);
  r.opt("fused_fwd_efficiency", a.fused_fwd_efficiency);
  r.opt("fused_bwd_efficiency", a.fused_bwd_efficiency);
  r.finish();
}

void read_value(const nlohmann::json& j, DeviceSpec& d, const std::string& path) {
  ObjectReader r(j, path);
  r.req("name", d.name);
  r.req("kind", d.kind);
  r.req("mem_bytes", d.mem_bytes);
  r.req("peak_flops", d.peak_flops);
  r.req("mem_bw_bytes_per_s", d.mem_bw_bytes_per_s);
  r.req("launch_overhead_s", d.launch_overhead_s);
  r.req("compute_efficiency", d.compute_efficiency);
  r.opt("mem_bw_achieved_bytes_per_s", d.mem_bw_achieved_bytes_per_s);
  r.opt("gemm", d.gemm);
  r.opt("attention", d.attention);
  r.finish();
}

void read_value(const nlohmann::json& j, OptimizerRate& o, const std::string& path) {
  ObjectReader r(j, path);
  r.req("per_tensor_params_per_s", o.per_tensor_params_per_s);
  r.req("flat_params_per_s", o.flat_params_per_s);
  r.finish();
}

void read_value(const nlohmann::json& j, HostOptimizerRates& o, const std::string& path) {
  ObjectReader r(j, path);
  r.req("adam", o.adam);
  r.req("sgd", o.sgd);
  r.finish();
}

void read_value(const nlohmann::json& j, HostSpec& h, const std::string& path) {
  ObjectReader r(j, path);
  r.req("mem_bytes", h.mem_bytes);
  r.req("cores", h.cores);
  r.req("bw_h2d_pinned_bytes_per_s", h.bw_h2d_pinned_bytes_per_s);
  r.req("bw_h2d_pageable_bytes_per_s", h.bw_h2d_pageable_bytes_per_s);
  r.req("bw_d2h_pinned_bytes_per_s", h.bw_d2h_pinned_bytes_per_s);
  r.req("bw_d2h_pageable_bytes_per_s", h.bw_d2h_pageable_bytes_per_s);
  r.req("memcpy_bw_bytes_per_s", h.memcpy_bw_bytes_per_s);
  r.req("optimizer", h.optimizer);
  r.finish();
}

void read_value(const nlohmann::json& j, Link& l, const std::string& path) {
  ObjectReader r(j, path);
  r.req("name", l.name);
  r.req("bw_bytes_per_s", l.bw_bytes_per_s);
  r.opt("latency_s", l.latency_s);
  r.finish();
}

void read_value(const nlohmann::json& j, Links& l, const std::string& path) {
  ObjectReader r(j, path);
  r.req("intra_node", l.intra_node);
  r.req("inter_node", l.inter_node);
  r.req("pcie", l.pcie);
  r.finish();
}

void read_value(const nlohmann::json& j, CollectiveFit& c, const std::string& path) {
  ObjectReader r(j, path);
  r.req("op", c.op);
  r.req("backend", c.backend);
  r.req("algorithm", c.algorithm);
  r.req("scope", c.scope);
  r.opt("dtype", c.dtype);
  r.req("world_sizes", c.world_sizes);
  r.req("alpha_s", c.alpha_s);
  r.req("beta_s_per_byte", c.beta_s_per_byte);
  r.opt("fit_residual", c.fit_residual);
  r.req("min_bytes", c.min_bytes);
  r.req("max_bytes", c.max_bytes);
  std::vector<std::vector<double>> points;
  r.opt("points", points);
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (points[i].size() != 2)
      throw SchemaError(path + ".points[" + std::to_string(i) + "] must be [bytes, seconds] (got " +
                        std::to_string(points[i].size()) + " numbers)");
    c.points.emplace_back(points[i][0], points[i][1]);
  }
  r.finish();
}

void read_value(const nlohmann::json& j, Provenance& p, const std::string& path) {
  ObjectReader r(j, path);
  r.req("source", p.source);
  r.req("citation", p.citation);
  r.finish();
}

ojson to_ordered_json(const ClusterProfile& c) {
  ojson j;
  j["schema"] = kClusterSchema;
  j["name"] = c.name;
  j["description"] = c.description;
  j["nodes"] = c.nodes;
  j["devices_per_node"] = c.devices_per_node;
  j["device"] = write_device(c.device);
  j["host"] = write_host(c.host);
  ojson links;
  links["intra_node"] = write_link(c.links.intra_node);
  links["inter_node"] = write_link(c.links.inter_node);
  links["pcie"] = write_link(c.links.pcie);
  j["links"] = links;
  j["collectives"] = write_array(c.collectives, write_collective);
  j["shares_cores"] = c.shares_cores;
  j["allocator_overhead_factor"] = c.allocator_overhead_factor;
  if (c.calibration != Calibration{}) {
    // Only the factors that are not neutral: every number written needs its provenance.
    ojson cal = ojson::object();
    for (const CalibrationField& f : calibration_fields())
      if (c.calibration.*f.field != Calibration{}.*f.field) cal[f.name] = c.calibration.*f.field;
    j["calibration"] = cal;
  }
  if (c.core_contention.measured()) {
    j["core_contention"] = ojson{{"compute_ranks_slowdown", c.core_contention.compute_ranks_slowdown},
                                 {"compute_with_comm_slowdown", c.core_contention.compute_with_comm_slowdown},
                                 {"comm_with_compute_slowdown", c.core_contention.comm_with_compute_slowdown}};
  }
  if (c.probe_other_load_cores >= 0) j["probe_other_load_cores"] = c.probe_other_load_cores;
  ojson provenance = ojson::object();
  for (const auto& [path, p] : c.provenance) provenance[path] = ojson{{"source", p.source}, {"citation", p.citation}};
  j["provenance"] = provenance;
  return j;
}

void read_value(const nlohmann::json& j, Calibration& cal, const std::string& path) {
  ObjectReader r(j, path);
  for (const CalibrationField& f : calibration_fields()) r.opt(f.name, cal.*f.field);
  r.finish();
}

void read_value(const nlohmann::json& j, CoreContention& cc, const std::string& path) {
  ObjectReader r(j, path);
  r.opt("compute_ranks_slowdown", cc.compute_ranks_slowdown);
  r.opt("compute_with_comm_slowdown", cc.compute_with_comm_slowdown);
  r.opt("comm_with_compute_slowdown", cc.comm_with_compute_slowdown);
  r.finish();
}

void read_resolved_cluster(const nlohmann::json& j, ClusterProfile& c) {
  ObjectReader r(j, kClusterWhere);
  check_schema(r, kClusterSchema);
  c = ClusterProfile{};
  r.req("name", c.name);
  r.opt("description", c.description);
  r.req("nodes", c.nodes);
  r.req("devices_per_node", c.devices_per_node);
  r.req("device", c.device);
  r.req("host", c.host);
  r.req("links", c.links);
  r.opt("collectives", c.collectives);
  r.req("shares_cores", c.shares_cores);
  r.opt("allocator_overhead_factor", c.allocator_overhead_factor);
  r.opt("calibration", c.calibration);
  r.opt("core_contention", c.core_contention);
  r.opt("probe_other_load_cores", c.probe_other_load_cores);
  r.req("provenance", c.provenance);
  r.finish();
  validate(c);
}

void to_json(nlohmann::json& j, const ClusterProfile& c) { j = to_plain(to_ordered_json(c)); }

void from_json(const nlohmann::json& j, ClusterProfile& c) {
  read_resolved_cluster(resolve_cluster_extends(j, std::filesystem::current_path(), "<json>"), c);
}

}  // namespace zeroplan
