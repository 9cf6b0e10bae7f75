// The probe's pieces, private to exec/src/probe/: machine and memory (machine.cpp), collectives
// (collectives.cpp, the worker side in collectives_worker.cpp), compute and optimizer (compute.cpp);
// probe.cpp assembles the ClusterProfile from them in a fixed order.
#pragma once

#include <c10/core/ScalarType.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "zeroplan/exec/probe.h"
#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/timer.h"

namespace zeroplan::exec {
class HostPool;
class Device;
}  // namespace zeroplan::exec

namespace zeroplan::exec::probe {

using Clock = std::chrono::steady_clock;
inline constexpr double kMiB = 1024.0 * 1024.0;
// constexpr, not std::vector: workers may run from a static initialiser (test binaries), before the
// probe's dynamic initialisers.
inline constexpr std::array<const char*, 4> kOps = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};
// The ops that sum elements, timed again at each 16-bit dtype (fits with CollectiveFit::dtype set).
inline constexpr std::array<const char*, 2> kReduceOps = {"all_reduce", "reduce_scatter"};
inline constexpr std::array<std::pair<const char*, c10::ScalarType>, 2> kReduceDtypes = {
    std::pair<const char*, c10::ScalarType>{"bf16", c10::ScalarType::BFloat16},
    std::pair<const char*, c10::ScalarType>{"fp16", c10::ScalarType::Half}};

// ---- timing ----

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median seconds of `reps` calls of f after `warmup` untimed ones.
template <class F>
double median_s(int reps, int warmup, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> samples;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    samples.push_back(seconds_since(t0));
  }
  return timing_stats(std::move(samples)).median_s;
}

// Mean seconds of `reps` calls of f after `warmup` untimed ones: for times that add up in a step (a
// collective slowed by compute on shared cores is slow in some calls and not others; the sum is the
// mean's, not the median's).
template <class F>
double mean_s(int reps, int warmup, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  double sum = 0;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    sum += seconds_since(t0);
  }
  return reps > 0 ? sum / reps : 0.0;
}

// v when finite and > 0; otherwise throws ProbeError naming `what`.
double positive(double v, const std::string& what);
std::string gbps(double bytes_per_s);  // "12.34 GB/s"

// ---- sizes ----

struct Sizes {
  std::int64_t stream_bytes;  // memory bandwidth and copies: larger than the last-level cache
  int stream_reps;
  std::int64_t gemm;  // fp32 GEMM m = n = k
  int gemm_reps;
  std::int64_t gemm_low;  // bf16/fp16 GEMM
  int gemm_low_reps;
  int tiny_batches;  // launch overhead and copy latency: batches of tiny_ops
  int tiny_ops;
  int opt_tensors;        // per-tensor optimizer: this many tensors of 4096
  std::int64_t opt_flat;  // flat optimizer: one tensor of this many
  int opt_reps;
  std::vector<std::int64_t> coll_bytes;
  int coll_reps;
  int coll_warmup;
  std::vector<std::int64_t> gemm_sweep;  // the GPU probe's m = n = k GEMMs
};
Sizes sizes_for(bool quick);

// ---- the machine (machine.cpp) ----

struct Machine {
  std::string cpu_model;
  int cores = 1;
  std::string cores_how;
  std::int64_t mem_bytes = 0;
  std::string mem_how;
  std::string cpuinfo;
};
Machine read_machine();  // /proc and /sys, capped by the cgroup's CPU quota and memory limit
// The value of the first "key : value" line of /proc/cpuinfo text, or "".
std::string cpuinfo_field(const std::string& text, const std::string& key);
std::string today_utc();  // "2026-01-31"

// What every measurement needs to record itself: the sizes, the machine, the rank's share of it, the
// provenance prefix and the progress line.
struct Context {
  const ProbeOptions& options;
  const Sizes& sizes;
  const Machine& machine;
  int ranks = 1;    // ranks per node (largest world size)
  int threads = 1;  // torch threads per rank
  std::string date;
  std::string as_rank;  // "<threads> torch thread(s), one rank's share of ..."
  std::function<void(const std::string&)> progress;
  Provenance measured(const std::string& method) const {
    return Provenance{"probe", "measured by zeroplan probe on " + date + ": " + method};
  }
};

// host.mem_bytes, host.cores, device.name/kind/mem_bytes.
void record_machine(ClusterProfile& c, const Context& x);
// device.mem_bw_bytes_per_s and device.launch_overhead_s.
void measure_memory(ClusterProfile& c, const Context& x);
// host D2H / H2D / memcpy bandwidth and links.pcie (copies between the device and host pools).
void measure_copies(ClusterProfile& c, const Context& x, Device& device, HostPool& host_pool);
// host.memcpy_bw_bytes_per_s: std::memcpy between two host-pool buffers.
void measure_host_memcpy(ClusterProfile& c, const Context& x, HostPool& host_pool);

// ---- a GPU (gpu.cpp) ----

struct GpuFacts {
  std::string name;           // the driver's name of the device ("NVIDIA H100 80GB HBM3"); Device::name on a CPU
  std::int64_t mem_bytes = 0;  // 0 when not a CUDA device
  int sm_count = 0;
};
GpuFacts gpu_facts(Device& dev);
// device.mem_bw_achieved_bytes_per_s, device.launch_overhead_s and the four host copy rates (pinned: the
// device's host pool; pageable: a plain host tensor), each work queued back to back and the device drained.
void measure_device(ClusterProfile& c, const Context& x, Device& dev);
// dtype -> achieved rate of m = n = k GEMMs for each sizes.gemm_sweep, random operands.
std::map<std::string, std::vector<GemmRate>> measure_gemm_sweep(const Context& x, Device& dev,
                                                                  const std::vector<std::string>& dtypes);

// ---- collectives (collectives.cpp, collectives_worker.cpp) ----

struct WorkerSettings {
  std::vector<std::int64_t> bytes;
  int reps = 5;
  int warmup = 1;
  int threads = 1;
};

// c.collectives: one launch of workers per world size, every op fitted; calibration.compute_time_scale
// from the smallest world size.
void measure_collectives(ClusterProfile& c, const Context& x);
// links.intra_node / inter_node from the first all_reduce fit, or from the memcpy bandwidth and the
// tiny-copy latency when collectives were not probed.
void record_links(ClusterProfile& c, const Context& x);

// ---- compute and optimizer (compute.cpp) ----

// device.peak_flops and device.compute_efficiency from GEMMs and the /proc/cpuinfo estimate.
void measure_compute(ClusterProfile& c, const Context& x);
// host.optimizer: the executor's FlatOptimizer on host-pool buffers.
void measure_optimizer(ClusterProfile& c, const Context& x, HostPool& host_pool);

}  // namespace zeroplan::exec::probe
