// zeroplan probe: measure this machine -> ClusterProfile (see probe.h for what a device is on a CPU).
#include "zeroplan/exec/probe.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "zeroplan/exec/communicator.h"
#include "zeroplan/exec/device.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/exec/launcher.h"
#include "zeroplan/exec/optimizer.h"
#include "zeroplan/exec/rendezvous.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/profiles/timer.h"

namespace zeroplan::exec {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;
// constexpr, not std::vector: workers may run from a static initialiser (test binaries), before this
// file's dynamic initialisers.
constexpr std::array<const char*, 4> kOps = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};

// ---- the machine, from /proc and /sys ----

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The value of the first "key : value" line of /proc/cpuinfo text, or "".
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

struct Machine {
  std::string cpu_model;
  int cores = 1;
  std::string cores_how;
  std::int64_t mem_bytes = 0;
  std::string mem_how;
  std::string cpuinfo;
};

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

// ---- timing ----

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

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

double positive(double v, const std::string& what) {
  if (!(std::isfinite(v) && v > 0)) throw ProbeError(fmt::format("{} measured as {} (expected > 0)", what, v));
  return v;
}

std::string gbps(double bytes_per_s) { return fmt::format("{:.2f} GB/s", bytes_per_s / 1e9); }

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
};

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
                 .coll_warmup = 1};
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
               .opt_flat = 1000 * 4096,
               .opt_reps = 5,
               .coll_bytes = {4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20},
               .coll_reps = 20,
               .coll_warmup = 2};
}

// ---- device and host measurements ----

struct Gemm {
  double flops_per_s = 0;
  std::int64_t size = 0;
  std::string error;  // why this dtype could not be measured
};

// Achieved FLOP/s of an n x n x n GEMM in `dtype`; flops_per_s 0 and the reason when it cannot run.
Gemm gemm_rate(torch::ScalarType dtype, std::int64_t n, int reps) {
  try {
    auto a = torch::rand({n, n}).to(dtype);
    auto b = torch::rand({n, n}).to(dtype);
    auto c = torch::empty({n, n}, torch::TensorOptions().dtype(dtype));
    const auto t0 = Clock::now();
    torch::mm_out(c, a, b);
    // A dtype that runs at a crawl (no hardware support) gets one sample, not a minute.
    const double first = seconds_since(t0);
    const double t = first > 1.0 ? first : median_s(reps, 0, [&] { torch::mm_out(c, a, b); });
    return {2.0 * static_cast<double>(n * n * n) / t, n, ""};
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    return {0, n, what.substr(0, what.find('\n'))};
  }
}

struct OptRates {
  double per_tensor = 0, flat = 0;  // params/s: many 4096-element segments, one flat segment
};

// The executor's FlatOptimizer over buffers in the host pool (the offloaded optimizer's state; a CPU
// device steps the same kernels on the same memory).
OptRates optimizer_rates(const Optimizer& config, HostPool& pool, const Sizes& s) {
  auto rate = [&](int tensors, std::int64_t numel) {
    std::vector<std::int64_t> segments(static_cast<std::size_t>(tensors), numel);
    auto alloc = [&](std::int64_t n) { return pool.zeros(n); };
    FlatOptimizer opt(config, segments, alloc);
    std::vector<torch::Tensor> params, grads;
    for (int i = 0; i < tensors; ++i) {
      params.push_back(alloc(numel).uniform_(-1, 1));
      grads.push_back(alloc(numel).normal_(0, 1e-3));
    }
    const double t = median_s(s.opt_reps, 1, [&] { opt.step(params, grads); });
    return static_cast<double>(tensors) * static_cast<double>(numel) / t;
  };
  return {rate(s.opt_tensors, 4096), rate(1, s.opt_flat)};
}

// ---- collectives ----

struct WorkerSettings {
  std::vector<std::int64_t> bytes;
  int reps = 5;
  int warmup = 1;
  int threads = 1;
};

nlohmann::json settings_json(const WorkerSettings& w) {
  return {{"bytes", w.bytes}, {"reps", w.reps}, {"warmup", w.warmup}, {"threads", w.threads}};
}

WorkerSettings worker_settings_from_env() {
  const char* text = std::getenv(kProbeWorkerEnv);
  if (text == nullptr) throw ProbeError(fmt::format("{} is not set", kProbeWorkerEnv));
  const auto j = nlohmann::json::parse(text);
  WorkerSettings w;
  w.bytes = j.at("bytes").get<std::vector<std::int64_t>>();
  w.reps = j.at("reps").get<int>();
  w.warmup = j.at("warmup").get<int>();
  w.threads = j.at("threads").get<int>();
  return w;
}

// Median seconds of one collective `op` over a buffer of about `bytes` (all_gather: the gathered
// output; reduce_scatter: the full input), as this rank sees it. Returns the exact bytes used.
std::pair<std::int64_t, double> time_collective(Communicator& comm, const std::string& op, std::int64_t bytes, int reps,
                                                int warmup) {
  const int n = comm.world_size();
  const std::int64_t elems = std::max<std::int64_t>(n, bytes / 4 / n * n);
  torch::Tensor full = torch::ones({elems});
  torch::Tensor part = torch::ones({elems / n});
  std::function<void()> once;
  if (op == "all_reduce") {
    once = [&] { comm.all_reduce(full, ReduceOp::kSum)->wait(); };
  } else if (op == "all_gather") {
    once = [&] { comm.all_gather(full, part)->wait(); };
  } else if (op == "reduce_scatter") {
    once = [&] { comm.reduce_scatter(part, full, ReduceOp::kSum)->wait(); };
  } else {
    // The last rank is the root, so rank 0 (whose times are used) waits for the data to arrive.
    once = [&] { comm.broadcast(full, n - 1)->wait(); };
  }
  comm.barrier();
  return {elems * 4, median_s(reps, warmup, once)};
}

struct CollectiveRun {
  std::map<std::string, std::vector<std::pair<double, double>>> points;  // op -> (bytes, median s)
  std::vector<std::string> fallbacks;
  int threads = 1;
  double compute_alone_s = 0;     // rank 0's median of a small MLP step, the other ranks idle
  double compute_together_s = 0;  // the same with every rank computing
};

CollectiveRun run_collectives(const ProbeOptions& o, int n, const WorkerSettings& settings) {
  namespace fs = std::filesystem;
  LaunchOptions lo;
  lo.executable = o.worker_executable;
  lo.timeout = o.worker_timeout;
  lo.capture_output = true;
  lo.env = {{kProbeWorkerEnv, settings_json(settings).dump()}, {"OMP_NUM_THREADS", std::to_string(settings.threads)}};
  LaunchResult r;
  try {
    r = launch_local(n, o.worker_argv, lo);
  } catch (const LaunchError& e) {
    throw ProbeError(fmt::format("collectives on {} ranks: {}", n, e.what()));
  }
  if (r.exit_code != 0) {
    throw ProbeError(fmt::format("collectives on {} ranks: {} (logs in {})", n, r.message, r.output_dir));
  }
  std::ifstream in(rank_file(r.output_dir, 0, ".json"));
  if (!in) throw ProbeError(fmt::format("collectives on {} ranks: rank 0 wrote no result in {}", n, r.output_dir));
  const auto j = nlohmann::json::parse(in);
  CollectiveRun run;
  run.threads = j.at("threads").get<int>();
  run.compute_alone_s = j.at("compute_alone_s").get<double>();
  run.compute_together_s = j.at("compute_together_s").get<double>();
  run.fallbacks = j.at("fallbacks").get<std::vector<std::string>>();
  for (const auto& [op, rows] : j.at("timings").items())
    for (const auto& row : rows)
      run.points[op].emplace_back(row.at("bytes").get<double>(), row.at("median_s").get<double>());
  for (const char* op : kOps) {
    if (run.points[op].empty())
      throw ProbeError(fmt::format("collectives on {} ranks: rank 0 reported no timings for {} (in {})", n, op,
                                   r.output_dir));
  }
  std::error_code ec;
  fs::remove_all(r.output_dir, ec);  // kept when something went wrong, for the logs
  return run;
}

// ---- assembling the profile ----

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

// ---- public pieces ----

AlphaBetaFit fit_alpha_beta(const std::vector<std::pair<double, double>>& points) {
  TORCH_INTERNAL_ASSERT(!points.empty());
  // Weighted least squares, w = 1/t^2 (relative error); bytes in MiB for conditioning.
  double s = 0, sx = 0, sxx = 0, st = 0, sxt = 0;
  for (const auto& [bytes, t] : points) {
    TORCH_INTERNAL_ASSERT(t > 0);
    const double w = 1.0 / (t * t), x = bytes / kMiB;
    s += w;
    sx += w * x;
    sxx += w * x * x;
    st += w * t;
    sxt += w * x * t;
  }
  double alpha = 0, beta = 0;  // beta per MiB here
  const double det = s * sxx - sx * sx;
  if (points.size() >= 2 && det > 1e-12 * s * sxx) {
    alpha = (sxx * st - sx * sxt) / det;
    beta = (s * sxt - sx * st) / det;
  } else {
    alpha = st / s;  // one size only: a constant
  }
  if (alpha < 0) {  // through the origin
    alpha = 0;
    beta = sxx > 0 ? sxt / sxx : 0;
  }
  if (beta < 0) {  // a constant
    beta = 0;
    alpha = st / s;
  }
  AlphaBetaFit f;
  f.alpha_s = alpha;
  f.beta_s_per_byte = beta / kMiB;
  double sq = 0;
  for (const auto& [bytes, t] : points) {
    const double e = (f.alpha_s + f.beta_s_per_byte * bytes - t) / t;
    sq += e * e;
  }
  f.residual = std::sqrt(sq / static_cast<double>(points.size()));
  return f;
}

std::optional<double> estimate_peak_fp32_flops(const std::string& cpuinfo, int threads, std::string* how) {
  const std::string mhz_text = cpuinfo_field(cpuinfo, "cpu MHz");
  const std::string flags_text = cpuinfo_field(cpuinfo, "flags");
  if (mhz_text.empty() || flags_text.empty()) return std::nullopt;
  double mhz = 0;
  try {
    mhz = std::stod(mhz_text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (!(mhz > 0)) return std::nullopt;
  std::istringstream in(flags_text);
  std::set<std::string> flags;
  for (std::string f; in >> f;) flags.insert(f);
  const int lanes = flags.count("avx512f") ? 16 : (flags.count("avx") || flags.count("avx2")) ? 8 : 4;
  const char* isa = lanes == 16 ? "avx512f" : lanes == 8 ? "avx/avx2" : "sse";
  const int per_lane = flags.count("fma") ? 2 : 1;
  const int units = 2;
  const double peak = threads * mhz * 1e6 * lanes * per_lane * units;
  if (how != nullptr) {
    *how = fmt::format(
        "{} core(s) x {:.0f} MHz (cpu MHz in /proc/cpuinfo) x {} fp32 lanes ({}) x {} ({}) x {} "
        "FMA units (assumed: two on every x86 core with AVX2 or AVX-512 server parts) = {:.1f} GFLOP/s",
        threads, mhz, lanes, isa, per_lane, per_lane == 2 ? "fma" : "no fma", units, peak / 1e9);
  }
  return peak;
}

bool is_collectives_worker() { return std::getenv(kProbeWorkerEnv) != nullptr; }

int run_collectives_worker() {
  std::unique_ptr<RankSession> session;
  RankContext ctx;
  try {
    const WorkerSettings w = worker_settings_from_env();
    ctx = rank_context_from_env();
    at::set_num_threads(std::max(1, w.threads));
    RendezvousOptions ro;
    ro.timeout = ctx.timeout.value_or(std::chrono::seconds(60));
    session = join(ctx, ro);
    Communicator& comm = session->comm();
    nlohmann::json out{{"rank", ctx.rank},
                       {"world_size", ctx.world_size},
                       {"threads", at::get_num_threads()},
                       {"backend", comm.backend()}};
    // One untimed pass over every op and size first: the first collectives after the group forms pay
    // for connection set-up and first-touch allocations.
    for (const std::string op : kOps)
      for (std::int64_t bytes : w.bytes) time_collective(comm, op, bytes, 1, 0);
    // Compute with the other ranks idle, then with every rank computing at once (as in training):
    // ranks on one machine share memory bandwidth and caches, so a unit profiled alone runs slower.
    {
      torch::manual_seed(0);
      torch::Tensor x = torch::randn({512, 256});
      torch::Tensor w1 = torch::randn({256, 1024}).mul_(0.05).requires_grad_(true);
      torch::Tensor w2 = torch::randn({1024, 256}).mul_(0.05).requires_grad_(true);
      auto once = [&] {
        torch::Tensor y = torch::layer_norm(torch::gelu(x.matmul(w1)).matmul(w2) + x, {256});
        y.pow(2).mean().backward();
        w1.mutable_grad() = torch::Tensor();
        w2.mutable_grad() = torch::Tensor();
      };
      const int reps = std::max(5, w.reps);
      comm.barrier();
      double alone = 0;
      if (ctx.rank == 0) alone = median_s(reps, 2, once);
      comm.barrier();
      const double together = median_s(reps, 2, once);
      comm.barrier();
      out["compute_alone_s"] = alone;
      out["compute_together_s"] = together;
    }
    nlohmann::json timings = nlohmann::json::object();
    for (const std::string op : kOps) {
      for (std::int64_t bytes : w.bytes) {
        const auto [used, t] = time_collective(comm, op, bytes, w.reps, w.warmup);
        timings[op].push_back({{"bytes", used}, {"median_s", t}});
      }
    }
    out["timings"] = timings;
    out["fallbacks"] = comm.fallbacks();
    comm.barrier();
    if (ctx.output_dir.empty()) throw ProbeError("ZEROPLAN_OUTPUT_DIR is not set (start workers with launch_local)");
    std::ofstream file(rank_file(ctx.output_dir, ctx.rank, ".json"));
    file << out.dump(1) << "\n";
    if (!file) throw ProbeError("cannot write " + rank_file(ctx.output_dir, ctx.rank, ".json"));
    session->finish();
    return 0;
  } catch (const std::exception& e) {
    const std::string message = fmt::format("probe worker rank {}: {}", ctx.rank, e.what());
    std::fprintf(stderr, "%s\n", message.c_str());
    if (session) {
      session->fail(message);
    } else {
      write_error_file(ctx.error_file, message);
    }
    return 1;
  }
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
    for (int n : world_sizes) {
      int ops = 0;
      for (const CollectiveFit& f : c.collectives)
        if (f.backend == "gloo" && std::count(f.world_sizes.begin(), f.world_sizes.end(), n)) ++ops;
      if (ops < static_cast<int>(kOps.size())) return std::nullopt;
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

  const Sizes s = sizes_for(o.quick);
  const Machine m = read_machine();
  const int ranks = o.world_sizes.empty() ? 1 : *std::max_element(o.world_sizes.begin(), o.world_sizes.end());
  const int threads = std::max(1, m.cores / ranks);
  const std::string date = today_utc();
  const std::string by = "measured by zeroplan probe on " + date + ": ";
  auto measured = [&](const std::string& method) { return Provenance{"probe", by + method}; };
  const std::string as_rank =
      fmt::format("{} torch thread(s), one rank's share of {} cores for {} ranks per node", threads, m.cores, ranks);

  Progress progress(o, 5 + static_cast<int>(o.collectives ? o.world_sizes.size() + 1 : 0));
  ClusterProfile c;
  c.name = o.name;
  c.nodes = 1;
  c.devices_per_node = ranks;
  c.shares_cores = true;
  c.allocator_overhead_factor = 1.0;
  c.provenance["devices_per_node"] =
      measured(fmt::format("the ranks per node the probe measured (largest of --world-sizes); each CPU "
                           "'device' is one rank with {}",
                           as_rank));
  c.provenance["shares_cores"] =
      measured("on a CPU, compute, copies, collectives (Gloo's threads) and the optimizer run on the same cores");
  c.provenance["allocator_overhead_factor"] =
      Provenance{"estimate",
                 "CPU device: the counting allocator reports the bytes ATen requests and the default CPU "
                 "allocator does not cache, so reserved = allocated (1.0 by construction, not measured)"};

  ThreadsGuard threads_guard(threads);
  auto device = make_device("cpu");  // the executor's pools: counting allocator + host arena
  HostPool& host_pool = device->host_pool();

  // Host: memory and cores.
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
  progress(fmt::format("machine: {}, {} cores, {:.1f} GiB; {} rank(s) per node of {} thread(s)", m.cpu_model, m.cores,
                       static_cast<double>(m.mem_bytes) / (kMiB * 1024), ranks, threads));

  // Collectives over Gloo on 127.0.0.1, one launch per world size (first: the workers fail fastest).
  if (o.collectives) {
    std::vector<int> sizes = o.world_sizes;
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    for (int n : sizes) {
      WorkerSettings w{s.coll_bytes, s.coll_reps, s.coll_warmup, std::max(1, m.cores / n)};
      const CollectiveRun run = run_collectives(o, n, w);
      std::string line = fmt::format("collectives on {} ranks (gloo, 127.0.0.1):", n);
      for (const std::string op : kOps) {
        const auto it = run.points.find(op);
        const AlphaBetaFit fit = fit_alpha_beta(it->second);
        CollectiveFit f;
        f.op = op;
        f.backend = "gloo";
        f.algorithm = "ring";
        f.scope = "intra_node";
        f.world_sizes = {n};
        f.alpha_s = fit.alpha_s;
        f.beta_s_per_byte = fit.beta_s_per_byte;
        f.fit_residual = fit.residual;
        f.min_bytes = static_cast<std::int64_t>(it->second.front().first);
        f.max_bytes = static_cast<std::int64_t>(it->second.back().first);
        std::string fallback;
        for (const std::string& fb : run.fallbacks)
          if (fb.rfind("gloo " + op, 0) == 0) fallback += "; what ran: " + fb;
        const std::string bytes_mean = op == "all_gather"       ? "the gathered output"
                                       : op == "reduce_scatter" ? "the full input"
                                                                : "the buffer";
        std::string medians;
        for (const auto& [bytes, t] : it->second)
          medians += fmt::format("{}{:.0f} B {:.1f} us", medians.empty() ? "" : ", ", bytes, t * 1e6);
        c.provenance[fmt::format("collectives[{}]", c.collectives.size())] = measured(fmt::format(
            "{} over Gloo on 127.0.0.1 with {} ranks started by launch_local ({} torch thread(s) each), rank 0's "
            "time to Work::wait (broadcast: rank 0 receives), median of {} after {} warm-up, bytes = {}; fitted as "
            "alpha + beta x bytes by least squares on relative error to the medians ({}){}",
            op, n, run.threads, s.coll_reps, s.coll_warmup, bytes_mean, medians, fallback));
        c.collectives.push_back(f);
        line += fmt::format(" {} {:.1f} us + {:.2f} GB/s (res {:.2f});", op, f.alpha_s * 1e6,
                            f.beta_s_per_byte > 0 ? 1e-9 / f.beta_s_per_byte : 0.0, f.fit_residual);
      }
      progress(line);
      // The smallest world size probed is the one the runs on this machine use first: its slowdown
      // calibrates every compute task (profiles are measured with one process running).
      if (n == sizes.front()) {
        const double slowdown = run.compute_alone_s > 0 ? run.compute_together_s / run.compute_alone_s : 0.0;
        progress(fmt::format("compute with {} ranks at once: x{:.3f} of one rank alone{}", n, slowdown,
                             slowdown > 1 ? "" : " (no slowdown recorded)"));
        if (slowdown > 1) {
          c.calibration.compute_time_scale = slowdown;
          c.provenance["calibration.comm_time_scale"] =
              Provenance{"estimate", "1: the probe times collectives alone; zeroplan autopilot --grid --calibrate "
                                     "fits this factor from runs"};
          c.provenance["calibration.compute_time_scale"] = measured(fmt::format(
              "rank 0's median time of a small MLP forward + backward (512 x 256 -> 1024 -> 256, {} thread(s)) with "
              "all {} ranks computing at once ({:.3f} ms) over the same with the others idle ({:.3f} ms)",
              run.threads, n, run.compute_together_s * 1e3, run.compute_alone_s * 1e3));
        }
      }
    }
  }

  // Device memory bandwidth: a large copy, bytes read + written per second.
  {
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
    auto x = torch::zeros({1});
    std::vector<double> per_op;
    for (int b = 0; b < s.tiny_batches; ++b) {
      const auto t0 = Clock::now();
      for (int i = 0; i < s.tiny_ops; ++i) x.add_(1.0);
      per_op.push_back(seconds_since(t0) / s.tiny_ops);
    }
    c.device.launch_overhead_s = positive(timing_stats(per_op).median_s, "launch overhead");
    c.provenance["device.launch_overhead_s"] = measured(
        fmt::format("time of one in-place add on a 1-element tensor (ATen dispatch), median of {} batches of {}",
                    s.tiny_batches, s.tiny_ops));
    progress(fmt::format("memory bandwidth {} (copy, read + write); launch overhead {:.2f} us",
                         gbps(c.device.mem_bw_bytes_per_s), c.device.launch_overhead_s * 1e6));
  }

  // Compute: GEMMs; efficiency against the peak estimated from /proc/cpuinfo.
  {
    const Gemm fp32 = gemm_rate(torch::kFloat32, s.gemm, s.gemm_reps);
    positive(fp32.flops_per_s, "fp32 GEMM FLOP/s");
    std::string how;
    const std::optional<double> est = estimate_peak_fp32_flops(m.cpuinfo, threads, &how);
    const std::string gemm_how = fmt::format("fp32 GEMM {0}x{0}x{0} (torch::mm_out, 2mnk FLOPs), median of {1}, {2}",
                                             fp32.size, s.gemm_reps, as_rank);
    if (est && *est >= fp32.flops_per_s) {
      c.device.peak_flops["fp32"] = *est;
      c.device.compute_efficiency = fp32.flops_per_s / *est;
      c.provenance["device.peak_flops.fp32"] = Provenance{"estimate", "estimated from /proc/cpuinfo: " + how};
      c.provenance["device.compute_efficiency"] = measured(
          fmt::format("achieved / estimated peak: {} achieved {:.1f} GFLOP/s", gemm_how, fp32.flops_per_s / 1e9));
    } else {
      c.device.peak_flops["fp32"] = fp32.flops_per_s;
      c.device.compute_efficiency = 1.0;
      const std::string why =
          est ? fmt::format(
                    "the GEMM beat the peak estimated from /proc/cpuinfo ({}), so the "
                    "achieved rate is taken as the peak",
                    how)
              : "no clock or SIMD flags in /proc/cpuinfo, so the achieved rate is taken as the peak";
      c.provenance["device.peak_flops.fp32"] = measured(gemm_how + "; " + why);
      c.provenance["device.compute_efficiency"] = measured("1 by definition: " + why);
    }
    std::string low;
    for (const auto& [dtype, name] : {std::pair{torch::kBFloat16, "bf16"}, std::pair{torch::kFloat16, "fp16"}}) {
      const Gemm g = gemm_rate(dtype, s.gemm_low, s.gemm_low_reps);
      if (!(g.flops_per_s > 0)) {
        low += fmt::format(", {} not measured ({})", name, g.error);
        continue;
      }
      c.device.peak_flops[name] = g.flops_per_s / c.device.compute_efficiency;
      c.provenance[std::string("device.peak_flops.") + name] = measured(
          fmt::format("{0} GEMM {1}x{1}x{1} achieved {2:.1f} GFLOP/s (median of {3}, {4}); recorded as achieved / "
                      "compute_efficiency so that peak x efficiency is the achieved rate",
                      name, g.size, g.flops_per_s / 1e9, s.gemm_low_reps, as_rank));
      low += fmt::format(", {} {:.1f}", name, g.flops_per_s / 1e9);
    }
    progress(fmt::format("GEMM achieved fp32 {:.1f}{} GFLOP/s; efficiency {:.2f} of peak {:.1f} GFLOP/s",
                         fp32.flops_per_s / 1e9, low, c.device.compute_efficiency, c.device.peak_flops["fp32"] / 1e9));
  }

  // Host: D2H and H2D = copies between the device pool and the host pool; memcpy; tiny-copy latency.
  {
    const std::int64_t n = s.stream_bytes / 4;
    auto dev = torch::rand({n});
    auto host = host_pool.zeros(n);
    const double t_d2h = median_s(s.stream_reps, 1, [&] { device->copy_d2h(host, dev); });
    const double t_h2d = median_s(s.stream_reps, 1, [&] { device->copy_h2d(dev, host); });
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

    auto other = host_pool.zeros(n);
    void* dst = other.data_ptr();
    const void* src = host.data_ptr();
    const std::size_t len = static_cast<std::size_t>(s.stream_bytes);
    const double t_memcpy = median_s(s.stream_reps, 1, [&] { std::memcpy(dst, src, len); });
    c.host.memcpy_bw_bytes_per_s = positive(bytes / t_memcpy, "memcpy bandwidth");
    c.provenance["host.memcpy_bw_bytes_per_s"] = measured(fmt::format(
        "std::memcpy of {:.0f} MiB between two host-pool buffers (one thread), bytes copied per second, median of {}",
        s.stream_bytes / kMiB, s.stream_reps));

    auto one_dev = torch::zeros({1});
    auto one_host = host_pool.zeros(1);
    std::vector<double> per_copy;
    for (int b = 0; b < s.tiny_batches; ++b) {
      const auto t0 = Clock::now();
      for (int i = 0; i < s.tiny_ops; ++i) device->copy_h2d(one_dev, one_host);
      per_copy.push_back(seconds_since(t0) / s.tiny_ops);
    }
    c.links.pcie.name = "memcpy between the CPU device and host pools (no PCIe)";
    c.links.pcie.bw_bytes_per_s = c.host.memcpy_bw_bytes_per_s;
    c.links.pcie.latency_s = timing_stats(per_copy).median_s;
    c.provenance["links.pcie.bw_bytes_per_s"] = measured("the host memcpy bandwidth (a CPU device has no PCIe)");
    c.provenance["links.pcie.latency_s"] = measured(fmt::format(
        "time of one Device::copy_h2d of a 1-element tensor, median of {} batches of {}", s.tiny_batches, s.tiny_ops));
    progress(fmt::format("copies: D2H {}, H2D {}, memcpy {}, tiny copy {:.2f} us", gbps(d2h), gbps(h2d),
                         gbps(c.host.memcpy_bw_bytes_per_s), c.links.pcie.latency_s * 1e6));
  }

  // Optimizer: the executor's FlatOptimizer on host-pool buffers (offload.optimizer; a CPU device's step).
  {
    Optimizer adam;
    adam.name = "adam";
    Optimizer sgd;
    sgd.name = "sgd";
    sgd.lr = 0.01;
    sgd.momentum = 0.9;
    std::string line = "optimizer (params/s):";
    for (const auto& [config, name, rate] :
         {std::tuple{&adam, "adam", &c.host.optimizer.adam}, std::tuple{&sgd, "sgd", &c.host.optimizer.sgd}}) {
      const OptRates r = optimizer_rates(*config, host_pool, s);
      rate->per_tensor_params_per_s = positive(r.per_tensor, std::string(name) + " per-tensor rate");
      rate->flat_params_per_s = positive(r.flat, std::string(name) + " flat rate");
      const std::string what = std::string(name) == "adam" ? "Adam (lr 1e-3, betas 0.9/0.999)" : "SGD (momentum 0.9)";
      const std::string common = fmt::format(
          "exec::FlatOptimizer::step (PyTorch's fused {} kernel, in place) on host-pool buffers, {}, median of {} "
          "steps, {}",
          name, what, s.opt_reps, as_rank);
      c.provenance[fmt::format("host.optimizer.{}.per_tensor_params_per_s", name)] =
          measured(fmt::format("{} segments of 4096 fp32 parameters, {}", s.opt_tensors, common));
      c.provenance[fmt::format("host.optimizer.{}.flat_params_per_s", name)] =
          measured(fmt::format("one flat segment of {} fp32 parameters, {}", s.opt_flat, common));
      line += fmt::format(" {} {:.3g} per-tensor / {:.3g} flat;", name, r.per_tensor, r.flat);
    }
    progress(line);
  }

  if (o.collectives) {
    // Links: the loopback path seen by a ring all_reduce on the fewest ranks.
    const CollectiveFit& ar = c.collectives.front();
    const int n = ar.world_sizes.front();
    const double bus = 2.0 * (n - 1) / n;
    if (ar.beta_s_per_byte > 0) {
      for (auto [link, field] :
           {std::pair{&c.links.intra_node, "intra_node"}, std::pair{&c.links.inter_node, "inter_node"}}) {
        link->name = "loopback TCP (Gloo on 127.0.0.1)";
        link->bw_bytes_per_s = bus / ar.beta_s_per_byte;
        link->latency_s = ar.alpha_s / (2.0 * (n - 1));
        c.provenance[std::string("links.") + field] = measured(fmt::format(
            "from the all_reduce fit on {} ranks (collectives[0]) read as a ring: bandwidth = 2(n-1)/n / beta, "
            "latency = alpha / 2(n-1){}",
            n, std::string(field) == "inter_node" ? "; one node only, so inter-node is taken equal to loopback" : ""));
      }
    }
  }
  if (c.links.intra_node.bw_bytes_per_s <= 0) {
    for (auto [link, field] :
         {std::pair{&c.links.intra_node, "intra_node"}, std::pair{&c.links.inter_node, "inter_node"}}) {
      link->name = "loopback (not measured)";
      link->bw_bytes_per_s = c.host.memcpy_bw_bytes_per_s;
      link->latency_s = c.links.pcie.latency_s;
      c.provenance[std::string("links.") + field] =
          Provenance{"estimate", "collectives not probed: the memcpy bandwidth and the tiny-copy latency"};
    }
  }

  c.description = fmt::format(
      "this machine ({}, {} cores, {:.0f} GiB) as zeroplan probe measured it on {}: {} "
      "rank(s) per node of {} thread(s), Gloo on 127.0.0.1",
      m.cpu_model, m.cores, static_cast<double>(m.mem_bytes) / (kMiB * 1024), date, ranks, threads);
  validate(c);
  return c;
}

}  // namespace zeroplan::exec
