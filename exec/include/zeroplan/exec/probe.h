// `zeroplan probe`: measures this machine and returns a ClusterProfile with the provenance of every
// number ("measured by zeroplan probe on <date>: <method>").
//
// CPU is the device (DESIGN.md): one device is one rank's share of the machine (cores / ranks per
// node threads), the device pool is the default allocator, the host pool the executor's separate
// arena, so H2D and D2H are memcpy between the two pools. Collectives are timed over Gloo on
// 127.0.0.1 by worker processes started with launch_local, and fitted as alpha + beta x bytes.
//
//   ProbeOptions o;                        // world sizes {2}, full sizes
//   o.worker_argv = {"zeroplan", "probe", "--collectives-worker"};
//   ClusterProfile c = probe_cluster(o);   // ~15-30 s on 2 cores
//
// The worker side: a process started by probe_cluster has kProbeWorkerEnv set; it must call
// run_collectives_worker() (the CLI's hidden `probe --collectives-worker`, or a test binary's
// static initialiser).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>

#include "zeroplan/profiles/errors.h"
#include <string>
#include <utility>
#include <vector>

#include "zeroplan/profiles/cluster.h"

namespace zeroplan::exec {

// The probe could not measure something (a worker failed or hung, a measurement was not finite).
// what() is one line.
class ProbeError : public Error {
 public:
  explicit ProbeError(const std::string& message) : Error(ErrorKind::run_failed, message) {}
};

struct ProbeOptions {
  std::string name = "local";               // ClusterProfile::name
  std::vector<int> world_sizes{2};          // collectives are fitted for each; each >= 2
  bool quick = false;                       // small sizes and few repeats (tests, CI): a few seconds
  bool collectives = true;                  // false: no workers, no fits; links from memcpy (tests)
  // device.mem_bytes: 0 = the node's memory (RAM, or the cgroup limit) / ranks per node.
  std::int64_t device_memory_bytes = 0;
  // How one collectives worker is started: argv[0] is its program name, the rest its arguments.
  std::vector<std::string> worker_argv{"zeroplan", "probe", "--collectives-worker"};
  std::string worker_executable;            // "" = this program (/proc/self/exe)
  std::chrono::milliseconds worker_timeout{std::chrono::seconds(90)};
  std::function<void(const std::string& line)> progress;  // one line per stage; may be empty

  ProbeOptions& set_world_sizes(std::vector<int> v) { world_sizes = std::move(v); return *this; }
  ProbeOptions& set_quick(bool v) { quick = v; return *this; }
  ProbeOptions& set_device_memory_bytes(std::int64_t v) { device_memory_bytes = v; return *this; }
};

// Measures the machine (progress on options.progress). Throws ExecError for bad options (a world size
// below 2), ProbeError when a measurement fails. The result validates (validate(ClusterProfile)).
ClusterProfile probe_cluster(const ProbeOptions& options);

// One timed GEMM of the GPU probe: C[m,n] = A[m,k] B[k,n], 2mnk / mean time, over `reps` products.
struct GemmRate {
  std::int64_t m = 0, n = 0, k = 0;
  double flops_per_s = 0;
  int reps = 0;
};

struct GpuProbe {
  ClusterProfile cluster;                                // see probe_gpu
  std::map<std::string, std::vector<GemmRate>> gemms;    // dtype -> the m = n = k sweep, smallest first
  std::string date;                                      // the probe's day, "2026-01-31"
};

// `zeroplan probe --device cuda`: one GPU and its host, measured on top of `base`, a cluster file of the
// same part (its datasheet peaks, tiles, links and what cannot be measured on one device stay). Replaced,
// each with provenance "probe": the host's memory, cores, memcpy and optimizer throughput (every core:
// one rank per node), the device's name, memory and SM count (CUDA runtime), achieved copy bandwidth,
// launch overhead, and pinned and pageable copies each way; one device per node. The GEMM sweep (each
// dtype of base's GEMM tables, else bf16 and fp16) is returned for the caller to fit base's buckets to
// (sim::fit_gemm_buckets; exec does not link the simulator). `device` "cpu" runs the same measurements
// on the CPU device (tests). Throws ExecError when the device does not exist, ProbeError when a
// measurement fails.
GpuProbe probe_gpu(const ProbeOptions& options, const ClusterProfile& base, const std::string& device = "cuda");

// The driver's name of `device` ("NVIDIA H100 80GB HBM3"), to pick the shipped file of its part; throws
// ExecError when there is no such device.
std::string device_display_name(const std::string& device);

// Other programs' load above which a probe measured a busy machine: a quarter of a core or a tenth of
// the machine's cores, whichever is more (the threshold compare uses for a run).
double busy_probe_load_cores(const ClusterProfile& cluster);

// The profile at `file` when it exists, is younger than `max_age`, reads and validates, has collective
// fits for every world size asked, and was not measured on a busy machine (probe_other_load_cores above
// busy_probe_load_cores); otherwise nullopt (never throws).
std::optional<ClusterProfile> fresh_probe(const std::filesystem::path& file, std::chrono::seconds max_age,
                                          const std::vector<int>& world_sizes);

// ---- the pieces, public for tests ----

// A least-squares fit of time(bytes) = alpha_s + beta_s_per_byte x bytes that minimises the relative
// error (weights 1 / time^2), so small and large messages count alike; alpha and beta are clamped at 0
// (refitting the other). residual = relative RMS of (fit - time) / time. Exact data is recovered exactly.
struct AlphaBetaFit {
  double alpha_s = 0;
  double beta_s_per_byte = 0;
  double residual = 0;
};
// REQUIRES: at least one point, every time > 0.
AlphaBetaFit fit_alpha_beta(const std::vector<std::pair<double, double>>& bytes_and_seconds);

// Peak FLOP/s of `threads` cores from /proc/cpuinfo text: clock (cpu MHz) x SIMD fp32 lanes (avx512f
// 16, avx/avx2 8, else 4) x 2 (fma) x 2 FMA units (assumed). nullopt when the text says
// neither clock nor flags (not x86). `how` receives the formula with its numbers.
std::optional<double> estimate_peak_fp32_flops(const std::string& cpuinfo, int threads, std::string* how);

// The environment variable that carries a worker's settings (JSON) from probe_cluster to the ranks.
inline constexpr const char* kProbeWorkerEnv = "ZEROPLAN_PROBE_WORKER";
bool is_collectives_worker();  // kProbeWorkerEnv is set

// One rank of the collectives probe (under launch_local): joins, times every collective the
// executor uses at each size, writes rank_file(ZEROPLAN_OUTPUT_DIR, rank, ".json"). Returns the
// process exit code (0, or 1 after recording the failure for the launcher); never throws.
int run_collectives_worker();

}  // namespace zeroplan::exec
