// The probe's machine and memory: cores and RAM from /proc and /sys, memory bandwidth, launch
// overhead, and copies between the device and host pools.
#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include "probe_parts.h"
#include "zeroplan/exec/device.h"

namespace zeroplan::exec::probe {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string cpuinfo_field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string k = line.substr(0, colon);
    k.erase(k.find_last_not_of(" \t") + 1);
    if (k != key) continue;
    std::string v = line.substr(colon + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    return v;
  }
  return "";
}

Machine read_machine() {
  Machine m;
  m.cpuinfo = read_text("/proc/cpuinfo");
  m.cpu_model = cpuinfo_field(m.cpuinfo, "model name");
  if (m.cpu_model.empty()) m.cpu_model = "unknown CPU";

  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    m.cores = CPU_COUNT(&set);
    m.cores_how = fmt::format("sched_getaffinity: {} CPUs this process may run on", m.cores);
  } else {
    m.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    m.cores_how = fmt::format("std::thread::hardware_concurrency: {}", m.cores);
  }
  // A cgroup v2 CPU quota ("200000 100000" = 2 CPUs) caps the cores as well.
  std::istringstream quota(read_text("/sys/fs/cgroup/cpu.max"));
  std::string q;
  double period = 0;
  if (quota >> q >> period && q != "max" && period > 0) {
    const int limit = std::max(1, static_cast<int>(std::ceil(std::stod(q) / period)));
    if (limit < m.cores) {
      m.cores = limit;
      m.cores_how += fmt::format(", capped to {} by the cgroup CPU quota (/sys/fs/cgroup/cpu.max)", limit);
    }
  }

  std::istringstream meminfo(read_text("/proc/meminfo"));
  for (std::string key; meminfo >> key;) {
    if (key == "MemTotal:") {
      std::int64_t kb = 0;
      meminfo >> kb;
      m.mem_bytes = kb * 1024;
      m.mem_how = "MemTotal in /proc/meminfo";
      break;
    }
  }
  if (m.mem_bytes <= 0) {
    m.mem_bytes = static_cast<std::int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
    m.mem_how = "sysconf(_SC_PHYS_PAGES) x page size";
  }
  const std::string limit = read_text("/sys/fs/cgroup/memory.max");
  if (!limit.empty() && std::isdigit(static_cast<unsigned char>(limit[0]))) {
    const std::int64_t cap = std::stoll(limit);
    if (cap > 0 && cap < m.mem_bytes) {
      m.mem_bytes = cap;
      m.mem_how += ", capped by the cgroup memory limit (/sys/fs/cgroup/memory.max)";
    }
  }
  return m;
}

std::string today_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

void record_machine(ClusterProfile& c, const Context& x) {
  const ProbeOptions& o = x.options;
  const Machine& m = x.machine;
  const int ranks = x.ranks;
  auto measured = [&](const std::string& method) { return x.measured(method); };
  c.host.mem_bytes = m.mem_bytes;
  c.host.cores = m.cores;
  c.provenance["host.mem_bytes"] = measured(m.mem_how);
  c.provenance["host.cores"] = measured(m.cores_how);
  c.device.name = "cpu (" + m.cpu_model + ")";
  c.device.kind = "cpu";
  if (o.device_memory_bytes > 0) {
    c.device.mem_bytes = o.device_memory_bytes;
    c.provenance["device.mem_bytes"] = Provenance{"estimate", "configured budget (zeroplan probe --device-memory)"};
  } else {
    c.device.mem_bytes = m.mem_bytes / ranks;
    c.provenance["device.mem_bytes"] =
        measured(fmt::format("the node's memory ({}) divided among its {} ranks", m.mem_how, ranks));
  }
  x.progress(fmt::format("machine: {}, {} cores, {:.1f} GiB; {} rank(s) per node of {} thread(s)", m.cpu_model, m.cores,
                       static_cast<double>(m.mem_bytes) / (kMiB * 1024), ranks, x.threads));
}

// A large copy, bytes read + written per second; the time of a tiny op.
void measure_memory(ClusterProfile& c, const Context& x) {
  const Sizes& s = x.sizes;
  const std::string& as_rank = x.as_rank;
  auto measured = [&](const std::string& method) { return x.measured(method); };
  const std::int64_t n = s.stream_bytes / 4;
  auto src = torch::rand({n});
  auto dst = torch::empty({n});
  const double t = median_s(s.stream_reps, 1, [&] { dst.copy_(src); });
  c.device.mem_bw_bytes_per_s = positive(2.0 * static_cast<double>(s.stream_bytes) / t, "memory bandwidth");
  c.provenance["device.mem_bw_bytes_per_s"] = measured(fmt::format(
      "Tensor::copy_ of {:.0f} MiB fp32 (larger than the last-level cache), bytes read + written per second, "
      "median of {}, {}",
      s.stream_bytes / kMiB, s.stream_reps, as_rank));
  // Launch overhead: the time of a tiny op.
  auto tiny = torch::zeros({1});
  std::vector<double> per_op;
  for (int b = 0; b < s.tiny_batches; ++b) {
    const auto t0 = Clock::now();
    for (int i = 0; i < s.tiny_ops; ++i) tiny.add_(1.0);
    per_op.push_back(seconds_since(t0) / s.tiny_ops);
  }
  c.device.launch_overhead_s = positive(timing_stats(per_op).median_s, "launch overhead");
  c.provenance["device.launch_overhead_s"] = measured(
      fmt::format("time of one in-place add on a 1-element tensor (ATen dispatch), median of {} batches of {}",
                  s.tiny_batches, s.tiny_ops));
  x.progress(fmt::format("memory bandwidth {} (copy, read + write); launch overhead {:.2f} us",
                       gbps(c.device.mem_bw_bytes_per_s), c.device.launch_overhead_s * 1e6));
}

void measure_host_memcpy(ClusterProfile& c, const Context& x, HostPool& host_pool) {
  const Sizes& s = x.sizes;
  const std::int64_t n = s.stream_bytes / 4;
  auto from = host_pool.zeros(n);
  auto to = host_pool.zeros(n);
  void* dst = to.data_ptr();
  const void* src = from.data_ptr();
  const std::size_t len = static_cast<std::size_t>(s.stream_bytes);
  const double t_memcpy = median_s(s.stream_reps, 1, [&] { std::memcpy(dst, src, len); });
  c.host.memcpy_bw_bytes_per_s = positive(static_cast<double>(s.stream_bytes) / t_memcpy, "memcpy bandwidth");
  c.provenance["host.memcpy_bw_bytes_per_s"] = x.measured(fmt::format(
      "std::memcpy of {:.0f} MiB between two host-pool buffers (one thread), bytes copied per second, median of {}",
      s.stream_bytes / kMiB, s.stream_reps));
}

// D2H and H2D = copies between the device pool and the host pool; memcpy; tiny-copy latency.
void measure_copies(ClusterProfile& c, const Context& x, Device& device, HostPool& host_pool) {
  const Sizes& s = x.sizes;
  const std::string& as_rank = x.as_rank;
  auto measured = [&](const std::string& method) { return x.measured(method); };
  const std::int64_t n = s.stream_bytes / 4;
  auto dev = torch::rand({n});
  auto host = host_pool.zeros(n);
  const double t_d2h = median_s(s.stream_reps, 1, [&] { device.copy_d2h(host, dev); });
  const double t_h2d = median_s(s.stream_reps, 1, [&] { device.copy_h2d(dev, host); });
  const double bytes = static_cast<double>(s.stream_bytes);
  const double d2h = positive(bytes / t_d2h, "D2H bandwidth"), h2d = positive(bytes / t_h2d, "H2D bandwidth");
  c.host.bw_d2h_pinned_bytes_per_s = c.host.bw_d2h_pageable_bytes_per_s = d2h;
  c.host.bw_h2d_pinned_bytes_per_s = c.host.bw_h2d_pageable_bytes_per_s = h2d;
  for (const char* dir : {"d2h", "h2d"})
    for (const char* kind : {"pinned", "pageable"})
      c.provenance[fmt::format("host.bw_{}_{}_bytes_per_s", dir, kind)] = measured(fmt::format(
          "Device::copy_{} of {:.0f} MiB between the CPU device pool (default allocator) and the executor's host "
          "pool, bytes copied per second, median of {}, {}; pinned = pageable on a CPU",
          dir, s.stream_bytes / kMiB, s.stream_reps, as_rank));

  measure_host_memcpy(c, x, host_pool);

  auto one_dev = torch::zeros({1});
  auto one_host = host_pool.zeros(1);
  std::vector<double> per_copy;
  for (int b = 0; b < s.tiny_batches; ++b) {
    const auto t0 = Clock::now();
    for (int i = 0; i < s.tiny_ops; ++i) device.copy_h2d(one_dev, one_host);
    per_copy.push_back(seconds_since(t0) / s.tiny_ops);
  }
  c.links.pcie.name = "memcpy between the CPU device and host pools (no PCIe)";
  c.links.pcie.bw_bytes_per_s = c.host.memcpy_bw_bytes_per_s;
  c.links.pcie.latency_s = timing_stats(per_copy).median_s;
  c.provenance["links.pcie.bw_bytes_per_s"] = measured("the host memcpy bandwidth (a CPU device has no PCIe)");
  c.provenance["links.pcie.latency_s"] = measured(fmt::format(
      "time of one Device::copy_h2d of a 1-element tensor, median of {} batches of {}", s.tiny_batches, s.tiny_ops));
  x.progress(fmt::format("copies: D2H {}, H2D {}, memcpy {}, tiny copy {:.2f} us", gbps(d2h), gbps(h2d),
                       gbps(c.host.memcpy_bw_bytes_per_s), c.links.pcie.latency_s * 1e6));
}

}  // namespace zeroplan::exec::probe
