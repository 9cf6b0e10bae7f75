// ClusterProfile ("zeroplan.cluster/1"): devices, host, links and collectives of a cluster, with the
// provenance of every number. Shipped profiles live in profiles/data/clusters/<name>.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace zeroplan {

// Achieved GEMM efficiency (achieved / peak FLOP/s) of one shape bucket: GEMMs with m >= m_min,
// n >= n_min and k >= k_min. A GEMM takes the LAST row of its dtype's list that it matches; the first
// row of every list has all three minimums 0, so every GEMM matches one.
struct GemmBucket {
  std::int64_t m_min = 0;
  std::int64_t n_min = 0;
  std::int64_t k_min = 0;
  double efficiency = 1;  // in (0, 1]

  bool operator==(const GemmBucket&) const = default;
};

// GEMM time model (NVIDIA "Matrix Multiplication Background" user guide): the output is cut into
// tile_m x tile_n tiles, one thread block each, run in waves of sm_count; the efficiency table holds
// what the rest of the kernel achieves by shape. Optional: an empty table means compute_efficiency for
// every shape, sm_count 0 no tile or wave quantisation.
struct GemmSpec {
  int sm_count = 0;
  std::int64_t tile_m = 0;
  std::int64_t tile_n = 0;
  std::map<std::string, std::vector<GemmBucket>> efficiency;  // dtype -> buckets

  bool empty() const { return sm_count == 0 && tile_m == 0 && tile_n == 0 && efficiency.empty(); }
  bool operator==(const GemmSpec&) const = default;
};

// Achieved / peak FLOP/s of a fused (flash) attention kernel, forward and backward; 0: the largest
// GEMM bucket's efficiency. Optional.
struct AttentionSpec {
  double fused_fwd_efficiency = 0;
  double fused_bwd_efficiency = 0;

  bool operator==(const AttentionSpec&) const = default;
};

struct DeviceSpec {
  std::string name;                              // "NVIDIA H100 SXM5 80GB", "cpu (AMD EPYC 7B13)"
  std::string kind;                              // "cuda" | "cpu"
  std::int64_t mem_bytes = 0;                    // usable device memory
  std::map<std::string, double> peak_flops;      // dtype ("fp32","tf32","fp16","bf16") -> dense FLOP/s; fp32 required
  double mem_bw_bytes_per_s = 0;                 // device memory bandwidth
  double launch_overhead_s = 0;                  // fixed cost per kernel (or per op on CPU)
  double compute_efficiency = 1;                 // achieved / peak for large GEMMs (roofline), in (0, 1]
  // Optional: what memory-bound kernels achieve (a STREAM-like copy); 0: mem_bw_bytes_per_s.
  double mem_bw_achieved_bytes_per_s = 0;
  GemmSpec gemm;                                 // optional (see GemmSpec)
  AttentionSpec attention;                       // optional (see AttentionSpec)

  bool operator==(const DeviceSpec&) const = default;
};

// Host-side optimizer throughput in parameters per second (all host cores).
struct OptimizerRate {
  double per_tensor_params_per_s = 0;  // one step per parameter tensor (torch.optim default, foreach off)
  double flat_params_per_s = 0;        // one step over one flat buffer

  bool operator==(const OptimizerRate&) const = default;
};

struct HostOptimizerRates {
  OptimizerRate adam;
  OptimizerRate sgd;

  bool operator==(const HostOptimizerRates&) const = default;
};

struct HostSpec {
  std::int64_t mem_bytes = 0;
  int cores = 0;                              // physical cores per node
  double bw_h2d_pinned_bytes_per_s = 0;       // achieved per device, one direction at a time
  double bw_h2d_pageable_bytes_per_s = 0;
  double bw_d2h_pinned_bytes_per_s = 0;
  double bw_d2h_pageable_bytes_per_s = 0;
  double memcpy_bw_bytes_per_s = 0;           // host memory to host memory
  HostOptimizerRates optimizer;

  bool operator==(const HostSpec&) const = default;
};

struct Link {
  std::string name;               // "NVLink4", "InfiniBand NDR 8x400G", "PCIe Gen5 x16"
  double bw_bytes_per_s = 0;      // intra_node: per device, one direction; inter_node: per node
  double latency_s = 0;           // optional for pcie, default 0

  bool operator==(const Link&) const = default;
};

struct Links {
  Link intra_node;
  Link inter_node;
  Link pcie;

  bool operator==(const Links&) const = default;
};

// An alpha-beta fit of one collective: time(bytes) = alpha_s + beta_s_per_byte x bytes, bytes being the
// buffer size per rank (nccl-tests "size"), valid for world sizes listed and bytes in [min, max].
struct CollectiveFit {
  std::string op;         // "all_reduce" | "all_gather" | "reduce_scatter" | "broadcast" | "reduce"
  std::string backend;    // "nccl" | "gloo" | "shm" (CPU ranks of one host through shared memory)
  std::string algorithm;  // "ring" | "tree"
  std::string scope;      // "intra_node" | "inter_node"
  std::vector<int> world_sizes;
  double alpha_s = 0;
  double beta_s_per_byte = 0;
  double fit_residual = 0;      // relative RMS residual of the fit
  std::int64_t min_bytes = 0;
  std::int64_t max_bytes = 0;
  // The element type the fit was measured with when it matters: "bf16" | "fp16" for a reducing op
  // (Gloo sums 16-bit elements converting each, slower per byte than fp32); "" = any (measured in fp32,
  // used for every dtype without a fit of its own).
  std::string dtype;
  // The measurements behind the fit, (bytes, seconds) by increasing bytes (optional, a probe's). With
  // two or more the simulator interpolates them piecewise linearly (beyond the largest, the last
  // segment's slope) instead of using alpha + beta x bytes: a straight line through sizes from 4 KiB
  // to 16 MiB misses the large ones, which leave the caches and dominate a step.
  std::vector<std::pair<double, double>> points;

  bool operator==(const CollectiveFit&) const = default;
};

struct Provenance {
  // "datasheet" | "paper" | "microbenchmark" (a published microbenchmark result: nccl-tests,
  // bandwidthTest, cuBLAS, STREAM) | "probe" | "estimate" | "calibration"
  std::string source;
  std::string citation;  // URL and section, or "measured by zeroplan probe on 2025-01-31"

  bool operator==(const Provenance&) const = default;
};

// Factors fitted from measured runs (zeroplan autopilot --grid --calibrate) for what a datasheet or a
// probe of one process alone cannot see, e.g. ranks slowing each other down on a shared machine.
// Written only when not 1; each factor then needs its provenance.
//
// The per-op GPU time model's terms (zeroplan calibrate; the shipped GPU files: fitted to public training
// runs, see SOURCES.md). Each refines a microbenchmark number for what a whole training step sees:
//   gemm_efficiency_scale   a GEMM achieves this fraction of the microbenchmark buckets' efficiency,
//   gemm_half_dim           times d / (d + gemm_half_dim), d = its smallest dimension (thin GEMMs are
//                           slower: cuBLAS picks smaller tiles, k loops are short); 0: no shape term
//   attention_efficiency_scale  fused attention's forward and backward efficiencies are multiplied by this
//   memory_bw_scale         memory-bound kernels achieve this fraction of mem_bw_achieved_bytes_per_s
//   kernel_gap_s            per kernel, added to launch_overhead_s: CPU dispatch gaps between kernels
//   compute_with_comm_slowdown  on GPUs, compute runs this much slower while a collective is in flight
//                           (NCCL's kernels take SMs and memory bandwidth), >= 1
// Efficiencies stay capped at 1.
struct Calibration {
  double compute_time_scale = 1;  // every compute task's time is multiplied by this, > 0
  double comm_time_scale = 1;     // every collective's time, > 0
  double gemm_efficiency_scale = 1;
  double gemm_half_dim = 0;
  double attention_efficiency_scale = 1;
  double memory_bw_scale = 1;
  double kernel_gap_s = 0;
  double compute_with_comm_slowdown = 1;
  bool operator==(const Calibration&) const = default;
};

// Every Calibration field once, in file order, with its valid range: what the reader, the writer (only the
// fields not at their default) and validate() go through, and what `zeroplan calibrate` fits by name.
struct CalibrationField {
  const char* name;
  double Calibration::*field;
  double lo, hi;     // valid range; open at lo when `positive` (the time scales: any value > 0)
  bool positive;
};
const std::vector<CalibrationField>& calibration_fields();

// How the ranks of a node that shares its cores (shares_cores) slow each other and themselves down,
// measured by `zeroplan probe` (1 everywhere: not measured). Each factor is a time ratio, >= 1 when there
// is contention (a measured ratio below 1 is noise and recorded as 1).
struct CoreContention {
  // Compute with every local rank computing at once over one rank computing alone. The simulator applies
  // it to profiles measured one rank alone (ModelProfile::concurrent_ranks 1), not to profiles measured
  // with the run's local ranks computing at once.
  double compute_ranks_slowdown = 1;
  // Compute while a collective is in flight on every rank over compute alone (every rank computing).
  double compute_with_comm_slowdown = 1;
  // A collective while every rank computes over the same collective alone.
  double comm_with_compute_slowdown = 1;
  bool measured() const { return *this != CoreContention{}; }
  bool operator==(const CoreContention&) const = default;
};

struct ClusterProfile {
  std::string name;                 // "a100-sxm-80gb"; "a100-sxm-80gb:128" when resolved with a node count
  std::string description;          // one line, for --help; optional
  int nodes = 1;
  int devices_per_node = 1;
  DeviceSpec device;
  HostSpec host;
  Links links;
  std::vector<CollectiveFit> collectives;   // may be empty: the simulator then derives costs from links
  bool shares_cores = false;                // compute, copies and collectives share cores (CPU clusters)
  double allocator_overhead_factor = 1.0;   // reserved / allocated bytes of the caching allocator, >= 1
  Calibration calibration;                  // optional
  CoreContention core_contention;           // optional (shares_cores clusters, measured by the probe)
  // Cores other programs kept busy on average while `zeroplan probe` measured (optional, -1: unknown;
  // a probe of a busy machine measures the busy machine: autopilot does not reuse it).
  double probe_other_load_cores = -1;
  // Field path ("device.mem_bytes", "device.peak_flops.bf16", "collectives[0]") -> where the number came
  // from. An entry covers its path and everything below it. Every number except `nodes` must be
  // covered, and every entry must name an existing path.
  std::map<std::string, Provenance> provenance;

  int world_size() const { return nodes * devices_per_node; }

  bool operator==(const ClusterProfile&) const = default;
};

inline constexpr const char* kClusterSchema = "zeroplan.cluster/1";

// Throws SchemaError naming the field and the number: positive sizes, bandwidths and rates, known
// kinds/dtypes/ops, compute_efficiency in (0,1], allocator_overhead_factor >= 1, collective
// min_bytes <= max_bytes, every number covered by provenance and no provenance entry dangling.
void validate(const ClusterProfile& cluster);

// nlohmann ADL hooks. from_json is strict and validates. A document may say
// {"schema": "zeroplan.cluster/1", "extends": "a100-sxm-80gb", "nodes": 128}: the base (a shipped name,
// or a path, relative to the current directory here and to the extending file in read_document) is
// loaded and the given keys override it (objects merge recursively, arrays and scalars replace).
// An overridden number without its own provenance entry gets source "estimate".
void to_json(nlohmann::json& j, const ClusterProfile& cluster);
void from_json(const nlohmann::json& j, ClusterProfile& cluster);

// Directory of shipped data: $ZEROPLAN_DATA_DIR if set, else ZEROPLAN_SOURCE_DIR "/profiles/data".
std::filesystem::path shipped_data_dir();
// shipped_data_dir() / "clusters".
std::filesystem::path shipped_clusters_dir();

struct ShippedCluster {
  std::string name;         // file stem, usable as a spec
  std::string description;  // one line
};
// Every <name>.json in shipped_clusters_dir(), sorted by name. Throws SchemaError if the dir is missing.
std::vector<ShippedCluster> list_shipped_clusters();

// Where `zeroplan probe` (without -o) and autopilot keep this machine's probe:
// $XDG_CACHE_HOME/zeroplan/probe-<hostname>.json, else ~/.cache/zeroplan/probe-<hostname>.json.
std::filesystem::path local_probe_path();

// A cluster from a spec string: "NAME" (shipped), "local" (this machine's cached probe,
// local_probe_path()), "PATH" (contains '/' or ends in .json), any of them followed by ":N" to set the
// node count (then name becomes "NAME:N"). Throws SchemaError listing the shipped names when NAME is
// unknown, and saying how to probe when "local" has no probe yet.
ClusterProfile resolve_cluster(std::string_view spec);

}  // namespace zeroplan
