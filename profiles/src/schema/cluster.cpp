#include "zeroplan/profiles/cluster.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

#include <fmt/format.h>

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

constexpr const char* kClusterWhere = "cluster";
constexpr int kMaxExtendsDepth = 8;

[[noreturn]] void cluster_error(const std::string& message) { fail(kClusterWhere, message); }

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

bool one_of(const std::string& v, std::initializer_list<const char*> allowed) {
  return std::any_of(allowed.begin(), allowed.end(), [&](const char* a) { return v == a; });
}

std::string list_of(std::initializer_list<const char*> allowed) {
  std::string s;
  for (const char* a : allowed) s += (s.empty() ? "" : ", ") + quote_json(a);
  return s;
}

void check_enum(const std::string& field, const std::string& v, std::initializer_list<const char*> allowed) {
  if (!one_of(v, allowed)) cluster_error(field + " must be one of " + list_of(allowed) + " (got " + quote_json(v) + ")");
}

void check_positive(const std::string& field, double v) {
  if (!(v > 0)) cluster_error(field + " must be > 0 (got " + num(v) + ")");
}
void check_positive(const std::string& field, std::int64_t v) {
  if (v <= 0) cluster_error(field + " must be > 0 (got " + num(v) + ")");
}
void check_non_negative(const std::string& field, double v) {
  if (!(v >= 0)) cluster_error(field + " must be >= 0 (got " + num(v) + ")");
}

// Every node of a JSON tree by path ("device.peak_flops.fp32", "collectives[0].world_sizes[1]"),
// calling `leaf` for numbers and `node` for every node.
template <class Json, class NodeFn>
void walk(const Json& j, const std::string& path, NodeFn&& node) {
  node(path, j);
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      walk(it.value(), path.empty() ? it.key() : path + "." + it.key(), node);
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) walk(j[i], path + "[" + std::to_string(i) + "]", node);
  }
}

// Keys of the cluster document that carry no numbers needing provenance.
bool outside_provenance(const std::string& top_key) {
  return top_key == "schema" || top_key == "name" || top_key == "description" || top_key == "provenance" ||
         top_key == "extends" || top_key == "nodes";
}

std::string top_key_of(const std::string& path) { return path.substr(0, path.find_first_of(".[")); }

// True when `provenance` has `path` or an ancestor of it.
template <class Map>
bool covered(const Map& provenance, const std::string& path) {
  for (std::size_t end = path.size();;) {
    if (provenance.count(path.substr(0, end))) return true;
    const std::size_t cut = path.find_last_of(".[", end - 1);
    if (cut == std::string::npos || cut == 0) return false;
    end = cut;
  }
}

// Numeric leaf paths of a cluster document that need provenance.
template <class Json>
std::vector<std::string> numeric_paths(const Json& j) {
  std::vector<std::string> out;
  walk(j, "", [&](const std::string& path, const Json& v) {
    if (!path.empty() && v.is_number() && !outside_provenance(top_key_of(path))) out.push_back(path);
  });
  return out;
}

std::vector<std::string> shipped_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(shipped_clusters_dir(), ec))
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

[[noreturn]] void unknown_cluster(const std::string& name) {
  const std::vector<std::string> names = shipped_names();
  std::string message = "unknown cluster " + quote_json(name);
  const std::string guess = closest_match(name, names);
  if (!guess.empty()) message += " (did you mean " + quote_json(guess) + "?)";
  std::string all;
  for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
  message += "; shipped: " + (all.empty() ? "none in " + shipped_clusters_dir().string() : all) +
             "; or give a path to a .json file";
  cluster_error(message);
}

bool looks_like_path(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 5 && s.substr(s.size() - 5) == ".json");
}

std::filesystem::path shipped_cluster_file(const std::string& name) {
  std::filesystem::path file = shipped_clusters_dir() / (name + ".json");
  if (!std::filesystem::is_regular_file(file)) unknown_cluster(name);
  return file;
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

void validate(const ClusterProfile& c) {
  if (c.name.empty()) cluster_error("name is empty");
  if (c.nodes < 1) cluster_error("nodes must be >= 1 (got " + num(c.nodes) + ")");
  if (c.devices_per_node < 1) cluster_error("devices_per_node must be >= 1 (got " + num(c.devices_per_node) + ")");
  // Ranks are counted in an int: a cluster past 2^24 devices (nodes x devices_per_node) is refused, not wrapped.
  if (c.nodes > 999999) cluster_error("nodes must be at most 999999 (got " + num(c.nodes) + ")");
  if (c.devices_per_node > 4096) cluster_error("devices_per_node must be at most 4096 (got " + num(c.devices_per_node) + ")");
  if (static_cast<std::int64_t>(c.nodes) * c.devices_per_node > (std::int64_t{1} << 24))
    cluster_error("nodes " + num(c.nodes) + " x devices_per_node " + num(c.devices_per_node) + " = " +
                  num(static_cast<std::int64_t>(c.nodes) * c.devices_per_node) + " devices, more than 2^24 (16,777,216)");

  const DeviceSpec& d = c.device;
  if (d.name.empty()) cluster_error("device.name is empty");
  check_enum("device.kind", d.kind, {"cuda", "cpu"});
  check_positive("device.mem_bytes", d.mem_bytes);
  if (!d.peak_flops.count("fp32")) cluster_error("device.peak_flops has no \"fp32\" entry");
  for (const auto& [dtype, flops] : d.peak_flops) {
    check_enum("device.peak_flops key", dtype, {"fp32", "tf32", "fp16", "bf16"});
    check_positive("device.peak_flops." + dtype, flops);
  }
  check_positive("device.mem_bw_bytes_per_s", d.mem_bw_bytes_per_s);
  check_non_negative("device.launch_overhead_s", d.launch_overhead_s);
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
    check_enum("device.gemm.efficiency key", dtype, {"fp32", "tf32", "fp16", "bf16"});
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

  const HostSpec& h = c.host;
  check_positive("host.mem_bytes", h.mem_bytes);
  if (h.cores < 1) cluster_error("host.cores must be >= 1 (got " + num(h.cores) + ")");
  check_positive("host.bw_h2d_pinned_bytes_per_s", h.bw_h2d_pinned_bytes_per_s);
  check_positive("host.bw_h2d_pageable_bytes_per_s", h.bw_h2d_pageable_bytes_per_s);
  check_positive("host.bw_d2h_pinned_bytes_per_s", h.bw_d2h_pinned_bytes_per_s);
  check_positive("host.bw_d2h_pageable_bytes_per_s", h.bw_d2h_pageable_bytes_per_s);
  check_positive("host.memcpy_bw_bytes_per_s", h.memcpy_bw_bytes_per_s);
  check_positive("host.optimizer.adam.per_tensor_params_per_s", h.optimizer.adam.per_tensor_params_per_s);
  check_positive("host.optimizer.adam.flat_params_per_s", h.optimizer.adam.flat_params_per_s);
  check_positive("host.optimizer.sgd.per_tensor_params_per_s", h.optimizer.sgd.per_tensor_params_per_s);
  check_positive("host.optimizer.sgd.flat_params_per_s", h.optimizer.sgd.flat_params_per_s);

  for (const auto& [field, link] : {std::pair{"links.intra_node", &c.links.intra_node},
                                    std::pair{"links.inter_node", &c.links.inter_node},
                                    std::pair{"links.pcie", &c.links.pcie}}) {
    if (link->name.empty()) cluster_error(std::string(field) + ".name is empty");
    check_positive(std::string(field) + ".bw_bytes_per_s", link->bw_bytes_per_s);
    check_non_negative(std::string(field) + ".latency_s", link->latency_s);
  }

  for (std::size_t i = 0; i < c.collectives.size(); ++i) {
    const CollectiveFit& f = c.collectives[i];
    const std::string at = "collectives[" + std::to_string(i) + "]";
    check_enum(at + ".op", f.op, {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"});
    check_enum(at + ".backend", f.backend, {"nccl", "gloo"});
    check_enum(at + ".algorithm", f.algorithm, {"ring", "tree"});
    check_enum(at + ".scope", f.scope, {"intra_node", "inter_node"});
    if (!f.dtype.empty()) check_enum(at + ".dtype", f.dtype, {"fp32", "bf16", "fp16"});
    if (f.world_sizes.empty()) cluster_error(at + ".world_sizes is empty");
    for (int n : f.world_sizes)
      if (n < 2) cluster_error(at + ".world_sizes has " + num(n) + " (must be >= 2)");
    check_non_negative(at + ".alpha_s", f.alpha_s);
    check_non_negative(at + ".beta_s_per_byte", f.beta_s_per_byte);
    check_non_negative(at + ".fit_residual", f.fit_residual);
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

  // Provenance: known sources, every number covered, no entry naming a path that does not exist.
  const ojson j = to_ordered_json(c);
  std::set<std::string> paths;
  walk(j, "", [&](const std::string& path, const ojson&) {
    if (!path.empty() && !outside_provenance(top_key_of(path))) paths.insert(path);
  });
  for (const auto& [path, p] : c.provenance) {
    check_enum("provenance." + path + ".source", p.source, {"datasheet", "paper", "microbenchmark", "probe", "estimate", "calibration"});
    if (p.citation.empty()) cluster_error("provenance." + path + ".citation is empty");
    if (!paths.count(path)) {
      std::string message = "provenance names " + quote_json(path) + ", which is not a field";
      const std::string guess = closest_match(path, std::vector<std::string>(paths.begin(), paths.end()));
      if (!guess.empty()) message += " (did you mean " + quote_json(guess) + "?)";
      cluster_error(message);
    }
  }
  for (const std::string& path : numeric_paths(j))
    if (!covered(c.provenance, path)) cluster_error("no provenance for " + path);
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

nlohmann::json resolve_cluster_extends(const nlohmann::json& j, const std::filesystem::path& base_dir,
                                       const std::string& origin, int depth) {
  if (!j.is_object() || !j.contains("extends")) return j;
  if (depth >= kMaxExtendsDepth)
    cluster_error("\"extends\" nested deeper than " + num(kMaxExtendsDepth) + " (a cycle?) at " + origin);
  {
    // The extending document must itself be a cluster document.
    const auto it = j.find("schema");
    if (it == j.end() || !it->is_string() || it->get<std::string>() != kClusterSchema)
      cluster_error(it == j.end() ? std::string("missing \"schema\" (expected \"") + kClusterSchema + "\")"
                                  : "schema is " + describe(*it) + ", expected \"" + kClusterSchema + "\"");
  }
  const nlohmann::json& extends = j["extends"];
  if (!extends.is_string() || extends.get<std::string>().empty())
    cluster_error("extends: expected a cluster name or path, got " + describe(extends));
  const std::string spec = extends.get<std::string>();
  std::filesystem::path base_file;
  if (looks_like_path(spec)) {
    base_file = std::filesystem::path(spec);
    if (base_file.is_relative()) base_file = base_dir / base_file;
  } else {
    base_file = shipped_cluster_file(spec);
  }
  nlohmann::json base = parse_json_file(base_file);
  try {
    base = resolve_cluster_extends(base, base_file.parent_path(), base_file.string(), depth + 1);
  } catch (const SchemaError& e) {
    if (depth == 0) throw SchemaError(base_file.string() + ": " + e.what());
    throw;
  }
  if (!base.is_object()) cluster_error("extends " + quote_json(spec) + ": not a JSON object");

  nlohmann::json child = j;
  child.erase("extends");
  nlohmann::json merged = base;
  merged.merge_patch(child);

  // A number the extending document sets without saying where it came from is an estimate.
  const nlohmann::json child_provenance =
      child.contains("provenance") && child["provenance"].is_object() ? child["provenance"] : nlohmann::json::object();
  std::map<std::string, int> child_keys;
  for (auto it = child_provenance.begin(); it != child_provenance.end(); ++it) child_keys[it.key()] = 1;
  for (const std::string& path : numeric_paths(child)) {
    if (covered(child_keys, path)) continue;
    merged["provenance"][path] = {{"source", "estimate"},
                                  {"citation", "set in " + origin + " over " + spec + ", no source given"}};
  }
  // Entries of the base about fields the child replaced wholesale (arrays) may now dangle; drop those.
  if (merged.contains("provenance") && merged["provenance"].is_object()) {
    std::set<std::string> paths;
    walk(merged, "", [&](const std::string& path, const nlohmann::json&) { paths.insert(path); });
    for (auto it = merged["provenance"].begin(); it != merged["provenance"].end();) {
      if (!paths.count(it.key()) && !child_keys.count(it.key()))
        it = merged["provenance"].erase(it);
      else
        ++it;
    }
  }
  if (!child.contains("name") && child.contains("nodes") && base.contains("name") && base["name"].is_string() &&
      merged["nodes"] != base["nodes"]) {
    std::string name = base["name"].get<std::string>();
    name = name.substr(0, name.find(':'));
    merged["name"] = name + ":" + merged["nodes"].dump();
  }
  return merged;
}

void to_json(nlohmann::json& j, const ClusterProfile& c) { j = to_plain(to_ordered_json(c)); }

void from_json(const nlohmann::json& j, ClusterProfile& c) {
  read_resolved_cluster(resolve_cluster_extends(j, std::filesystem::current_path(), "<json>"), c);
}

std::filesystem::path shipped_data_dir() {
  if (const char* dir = std::getenv("ZEROPLAN_DATA_DIR"); dir != nullptr && *dir != '\0')
    return std::filesystem::path(dir);
  return std::filesystem::path(ZEROPLAN_SOURCE_DIR) / "profiles" / "data";
}

std::filesystem::path shipped_clusters_dir() { return shipped_data_dir() / "clusters"; }

std::vector<ShippedCluster> list_shipped_clusters() {
  const std::filesystem::path dir = shipped_clusters_dir();
  if (!std::filesystem::is_directory(dir))
    cluster_error("no shipped cluster directory " + dir.string() + " (set ZEROPLAN_DATA_DIR)");
  std::vector<ShippedCluster> out;
  for (const std::string& name : shipped_names()) {
    ShippedCluster entry{name, ""};
    const nlohmann::json j = parse_json_file(dir / (name + ".json"));
    if (j.is_object() && j.contains("description") && j["description"].is_string())
      entry.description = j["description"].get<std::string>();
    out.push_back(std::move(entry));
  }
  return out;
}

std::filesystem::path local_probe_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::filesystem::path base =
      xdg != nullptr && *xdg ? std::filesystem::path(xdg) : std::filesystem::path(home != nullptr && *home ? home : "/tmp") / ".cache";
  char host[256] = "local";
  gethostname(host, sizeof host - 1);
  return base / "zeroplan" / ("probe-" + std::string(host) + ".json");
}

ClusterProfile resolve_cluster(std::string_view spec_view) {
  std::string spec(spec_view);
  int nodes = 0;
  const std::size_t colon = spec.rfind(':');
  if (colon != std::string::npos) {
    const std::string count = spec.substr(colon + 1);
    if (count.empty() || !std::all_of(count.begin(), count.end(), [](unsigned char ch) { return std::isdigit(ch); }))
      cluster_error("bad cluster spec " + quote_json(spec) + ": expected NAME, PATH, NAME:NODES or PATH:NODES");
    if (count.size() > 6 || std::stoi(count) < 1)
      cluster_error("bad cluster spec " + quote_json(spec) + ": node count " + count + " must be in 1..999999");
    nodes = std::stoi(count);
    spec = spec.substr(0, colon);
  }
  if (spec.empty()) cluster_error("empty cluster spec");
  std::filesystem::path file;
  if (spec == "local") {
    file = local_probe_path();
    if (!std::filesystem::exists(file))
      cluster_error("cluster local: no probe of this machine at " + file.string() +
                    "; run `zeroplan probe` (or `zeroplan autopilot`) first");
  } else {
    file = looks_like_path(spec) ? std::filesystem::path(spec) : shipped_cluster_file(spec);
  }
  ClusterProfile c = read_document<ClusterProfile>(file);
  if (nodes > 0) {
    c.nodes = nodes;
    c.name = c.name.substr(0, c.name.find(':')) + ":" + std::to_string(nodes);
    validate(c);
  }
  return c;
}

}  // namespace zeroplan
