// zeroplan probe: measure this machine -> ClusterProfile (see probe.h for what a device is on a CPU).
// This file owns the sizes, the order of the measurements and the profile's fixed fields; the
// measurements are in machine.cpp, collectives.cpp and compute.cpp (probe_parts.h).
#include "zeroplan/exec/probe.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "../step/cpu_times.h"
#include "probe_parts.h"
#include "zeroplan/exec/device.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/exec/shm_communicator.h"
#include "zeroplan/profiles/json_io.h"

namespace zeroplan::exec {
namespace probe {

double positive(double v, const std::string& what) {
  if (!(std::isfinite(v) && v > 0)) throw ProbeError(fmt::format("{} measured as {} (expected > 0)", what, v));
  return v;
}

std::string gbps(double bytes_per_s) { return fmt::format("{:.2f} GB/s", bytes_per_s / 1e9); }

Sizes sizes_for(bool quick) {
  if (quick) {
    return Sizes{.stream_bytes = 48 << 20,
                 .stream_reps = 5,
                 .gemm = 384,
                 .gemm_reps = 4,
                 .gemm_low = 256,
                 .gemm_low_reps = 2,
                 .tiny_batches = 8,
                 .tiny_ops = 200,
                 .opt_tensors = 200,
                 .opt_flat = 200 * 4096,
                 .opt_reps = 3,
                 .coll_bytes = {4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20},
                 .coll_reps = 5,
                 .coll_warmup = 1,
                 .gemm_sweep = {128, 256}};
  }
  return Sizes{.stream_bytes = 256 << 20,
               .stream_reps = 10,
               .gemm = 1024,
               .gemm_reps = 10,
               .gemm_low = 512,
               .gemm_low_reps = 4,
               .tiny_batches = 20,
               .tiny_ops = 1000,
               .opt_tensors = 1000,
               // Beyond any last-level cache, as a model's shard is (Adam touches 16 bytes per parameter:
               // 512 MiB here); 4M parameters stepped from cache ran 2.7x faster than gpt2-large's 774M
               // did on the lent H100's host.
               .opt_flat = std::int64_t{32} << 20,
               .opt_reps = 5,
               .coll_bytes = {4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20},
               .coll_reps = 20,
               .coll_warmup = 2,
               .gemm_sweep = {512, 1024, 2048, 4096, 8192}};
}

namespace {

class Progress {
 public:
  Progress(const ProbeOptions& o, int stages) : o_(o), stages_(stages), t0_(Clock::now()) {}
  void operator()(const std::string& line) {
    if (o_.progress) o_.progress(fmt::format("[{}/{}] {:5.1f} s  {}", ++done_, stages_, seconds_since(t0_), line));
  }

 private:
  const ProbeOptions& o_;
  int stages_;
  int done_ = 0;
  Clock::time_point t0_;
};

// Restores torch's thread count on scope exit.
class ThreadsGuard {
 public:
  explicit ThreadsGuard(int threads) : saved_(at::get_num_threads()) { at::set_num_threads(threads); }
  ~ThreadsGuard() { at::set_num_threads(saved_); }
  ThreadsGuard(const ThreadsGuard&) = delete;
  ThreadsGuard& operator=(const ThreadsGuard&) = delete;

 private:
  int saved_;
};

}  // namespace
}  // namespace probe

double busy_probe_load_cores(const ClusterProfile& cluster) {
  return std::max(0.25, 0.1 * static_cast<double>(cluster.host.cores));
}

std::optional<ClusterProfile> fresh_probe(const std::filesystem::path& file, std::chrono::seconds max_age,
                                          const std::vector<int>& world_sizes) {
  namespace fs = std::filesystem;
  try {
    std::error_code ec;
    const auto written = fs::last_write_time(file, ec);
    if (ec) return std::nullopt;
    if (fs::file_time_type::clock::now() - written > max_age) return std::nullopt;
    ClusterProfile c = read_document<ClusterProfile>(file);
    // Measured while other programs kept the machine busy: its core-sharing slowdown and collective
    // times are the busy machine's, not reused.
    if (c.probe_other_load_cores > busy_probe_load_cores(c)) return std::nullopt;
    // Probed before the probe measured how compute and collectives share the cores: probed again.
    if (c.shares_cores && !c.core_contention.measured()) return std::nullopt;
    // Probed before the 16-bit fits of the reducing ops, or with another transport than runs use now (Gloo
    // before the shared-memory collectives, or ZEROPLAN_CPU_TRANSPORT since): probed again.
    const std::string backend = cpu_backend(true);
    for (int n : world_sizes) {
      std::size_t ops = 0, ops16 = 0;
      for (const CollectiveFit& f : c.collectives) {
        if (f.backend != backend || !std::count(f.world_sizes.begin(), f.world_sizes.end(), n)) continue;
        ++(f.dtype.empty() ? ops : ops16);
      }
      if (ops < probe::kOps.size() || ops16 < probe::kReduceOps.size() * probe::kReduceDtypes.size())
        return std::nullopt;
    }
    return c;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

ClusterProfile probe_cluster(const ProbeOptions& o) {
  for (int n : o.world_sizes)
    if (n < 2) throw ExecError(fmt::format("world size {} for the collectives probe must be >= 2", n));
  if (o.collectives && o.world_sizes.empty()) throw ExecError("no world size to probe the collectives at");
  if (o.device_memory_bytes < 0) throw ExecError(fmt::format("device memory {} < 0", o.device_memory_bytes));

  const probe::Sizes s = probe::sizes_for(o.quick);
  const probe::Machine m = probe::read_machine();
  const int ranks = o.world_sizes.empty() ? 1 : *std::max_element(o.world_sizes.begin(), o.world_sizes.end());
  const int threads = std::max(1, m.cores / ranks);
  probe::Progress progress(o, 5 + static_cast<int>(o.collectives ? o.world_sizes.size() + 1 : 0));
  const probe::Context x{.options = o,
                           .sizes = s,
                           .machine = m,
                           .ranks = ranks,
                           .threads = threads,
                           .date = probe::today_utc(),
                           .as_rank = fmt::format(
                               "{} torch thread(s), one rank's share of {} cores for {} ranks per node", threads,
                               m.cores, ranks),
                           .progress = [&progress](const std::string& line) { progress(line); }};

  ClusterProfile c;
  c.name = o.name;
  c.nodes = 1;
  c.devices_per_node = ranks;
  c.shares_cores = true;
  c.allocator_overhead_factor = 1.0;
  c.provenance["devices_per_node"] =
      x.measured(fmt::format("the ranks per node the probe measured (largest of --world-sizes); each CPU "
                             "'device' is one rank with {}",
                             x.as_rank));
  c.provenance["shares_cores"] =
      x.measured("on a CPU, compute, copies, collectives (Gloo's threads) and the optimizer run on the same cores");
  c.provenance["allocator_overhead_factor"] =
      Provenance{"estimate",
                 "CPU device: the counting allocator reports the bytes ATen requests and the default CPU "
                 "allocator does not cache, so reserved = allocated (1.0 by construction, not measured)"};

  const CpuTimes cpu_from = read_cpu_times(/*with_children=*/true);  // the collectives' workers are children
  probe::ThreadsGuard threads_guard(threads);
  auto device = make_device("cpu");  // the executor's pools: counting allocator + host arena
  HostPool& host_pool = device->host_pool();

  // The order is the progress lines' order; collectives first: the workers fail fastest.
  probe::record_machine(c, x);
  if (o.collectives) probe::measure_collectives(c, x);  // Gloo on 127.0.0.1, one launch per world size
  probe::measure_memory(c, x);
  probe::measure_compute(c, x);
  probe::measure_copies(c, x, *device, host_pool);
  probe::measure_optimizer(c, x, host_pool);
  probe::record_links(c, x);
  c.probe_other_load_cores = other_load_cores(cpu_from, read_cpu_times(true));
  if (c.probe_other_load_cores >= 0) {
    c.provenance["probe_other_load_cores"] = x.measured(
        "the machine's busy CPU time (/proc/stat) while the probe ran, less the probe's own and its workers'");
  }

  c.description = fmt::format(
      "this machine ({}, {} cores, {:.0f} GiB) as zeroplan probe measured it on {}: {} "
      "rank(s) per node of {} thread(s), Gloo on 127.0.0.1",
      m.cpu_model, m.cores, static_cast<double>(m.mem_bytes) / (probe::kMiB * 1024), x.date, ranks, threads);
  validate(c);
  return c;
}

std::string device_display_name(const std::string& device) {
  auto dev = make_device(device);
  return probe::gpu_facts(*dev).name;
}

GpuProbe probe_gpu(const ProbeOptions& o, const ClusterProfile& base, const std::string& device) {
  auto dev = make_device(device);  // ExecError when there is no such device
  const probe::Sizes s = probe::sizes_for(o.quick);
  const probe::Machine m = probe::read_machine();
  probe::Progress progress(o, 5);
  const probe::Context x{.options = o,
                         .sizes = s,
                         .machine = m,
                         .ranks = 1,
                         .threads = m.cores,
                         .date = probe::today_utc(),
                         .as_rank = fmt::format("{} torch thread(s), the host of one device", m.cores),
                         .progress = [&progress](const std::string& line) { progress(line); }};
  probe::ThreadsGuard threads_guard(m.cores);

  GpuProbe r;
  r.date = x.date;
  ClusterProfile& c = r.cluster;
  c = base;
  c.name = o.name;
  c.nodes = 1;
  c.devices_per_node = 1;
  c.provenance["devices_per_node"] = x.measured("one device probed (zeroplan probe --device)");
  const probe::GpuFacts f = probe::gpu_facts(*dev);
  c.device.name = f.name;
  if (f.mem_bytes > 0) {
    c.device.mem_bytes = f.mem_bytes;
    c.provenance["device.mem_bytes"] = x.measured("cudaDeviceProp::totalGlobalMem of " + dev->name());
  }
  if (f.sm_count > 0) {
    c.device.gemm.sm_count = f.sm_count;
    c.provenance["device.gemm.sm_count"] = x.measured("cudaDeviceProp::multiProcessorCount of " + dev->name());
  }
  progress(fmt::format("{} ({}, {:.1f} GiB, {} SMs) on {} with {} cores, {:.1f} GiB; datasheet numbers from {}", f.name,
                       dev->name(), static_cast<double>(c.device.mem_bytes) / (probe::kMiB * 1024),
                       c.device.gemm.sm_count, m.cpu_model, m.cores,
                       static_cast<double>(m.mem_bytes) / (probe::kMiB * 1024), base.name));

  c.host.mem_bytes = m.mem_bytes;
  c.host.cores = m.cores;
  c.provenance["host.mem_bytes"] = x.measured(m.mem_how);
  c.provenance["host.cores"] = x.measured(m.cores_how);
  probe::measure_host_memcpy(c, x, dev->host_pool());
  probe::measure_optimizer(c, x, dev->host_pool());
  probe::measure_device(c, x, *dev);
  std::vector<std::string> dtypes;
  for (const auto& [dtype, buckets] : base.device.gemm.efficiency) dtypes.push_back(dtype);
  if (dtypes.empty()) dtypes = {"bf16", "fp16"};
  r.gemms = probe::measure_gemm_sweep(x, *dev, dtypes);

  c.description = fmt::format("{} on this machine ({}, {} cores), as zeroplan probe --device measured it on {} over {}",
                              f.name, m.cpu_model, m.cores, x.date, base.name);
  validate(c);
  return r;
}

}  // namespace zeroplan::exec
