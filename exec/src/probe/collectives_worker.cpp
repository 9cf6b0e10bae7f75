// The probe's collectives worker: one rank under launch_local that times every collective the
// executor uses at each size, and a small MLP step alone and with every rank computing.
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "probe_parts.h"
#include "zeroplan/exec/communicator.h"
#include "zeroplan/exec/launcher.h"
#include "zeroplan/exec/rendezvous.h"

namespace zeroplan::exec {
namespace probe {
namespace {

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

// Seconds of one collective `op` (the trimmed mean of the repetitions, n/10 dropped each end: a step sums
// its collectives, whose slow samples count; a median missed Gloo's bimodal times, 1 MiB bf16 all_reduce
// 1.07 ms in the probe against 3.5-4.5 ms back to back in a run) over a buffer of about `bytes` (all_gather: the gathered
// output; reduce_scatter: the full input) of `dtype` elements, as this rank sees it. Returns the exact
// bytes used. Each repetition starts from cold caches, as in a step, where a collective's buffer was
// written among everything else the step touched: a 64 MiB scratch buffer is written first (untimed;
// measured: a 21 MB all_reduce took 15.3 ms repeated back to back, 17.2 ms after such writes), then the
// ranks meet at a barrier.
std::pair<std::int64_t, double> time_collective(Communicator& comm, const std::string& op, std::int64_t bytes, int reps,
                                                int warmup, torch::ScalarType dtype = torch::kFloat32) {
  const int n = comm.world_size();
  const std::int64_t size = c10::elementSize(dtype);
  const std::int64_t elems = std::max<std::int64_t>(n, bytes / size / n * n);
  torch::Tensor full = torch::ones({elems}, dtype);
  torch::Tensor part = torch::ones({elems / n}, dtype);
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
  static torch::Tensor scratch = torch::empty({64 << 18});  // 64 MiB of fp32
  std::vector<double> samples;
  for (int i = 0; i < warmup + reps; ++i) {
    scratch.fill_(static_cast<float>(i));
    comm.barrier();
    const auto t0 = Clock::now();
    once();
    if (i >= warmup) samples.push_back(seconds_since(t0));
  }
  comm.barrier();
  return {elems * size, timing_stats(std::move(samples)).trimmed_mean_s};
}

}  // namespace
}  // namespace probe

bool is_collectives_worker() { return std::getenv(kProbeWorkerEnv) != nullptr; }

namespace {

// Compute with the other ranks idle, then with every rank computing at once (as in training):
// ranks on one machine share memory bandwidth and caches, so a unit profiled alone runs slower.
// Then how compute and a collective in flight slow each other on the shared cores: compute while
// every rank has an all_reduce in flight on another thread, and the all_reduce while every rank
// computes on another thread.
void measure_contention(Communicator& comm, const RankContext& ctx, const probe::WorkerSettings& w, nlohmann::json& out) {
  torch::manual_seed(0);
  torch::Tensor x = torch::randn({512, 256});
  struct Mlp {
    torch::Tensor w1 = torch::randn({256, 1024}).mul_(0.05).requires_grad_(true);
    torch::Tensor w2 = torch::randn({1024, 256}).mul_(0.05).requires_grad_(true);
  };
  Mlp main_mlp, side_mlp;
  auto step = [&x](Mlp& m) {
    torch::Tensor y = torch::layer_norm(torch::gelu(x.matmul(m.w1)).matmul(m.w2) + x, {256});
    y.pow(2).mean().backward();
    m.w1.mutable_grad() = torch::Tensor();
    m.w2.mutable_grad() = torch::Tensor();
  };
  auto once = [&] { step(main_mlp); };
  const int reps = std::max(5, w.reps);
  comm.barrier();
  double alone = 0;
  if (ctx.rank == 0) alone = probe::mean_s(reps, 2, once);
  comm.barrier();
  const double together = probe::mean_s(reps, 2, once);
  comm.barrier();
  out["compute_alone_s"] = alone;
  out["compute_together_s"] = together;

  // The collectives the executor overlaps with compute (gathers of parameters, reductions of
  // gradients) at 1 MiB, 4 MiB and the largest size probed, alone and while every rank computes on
  // another thread: mean times (the slowdown is erratic, a scheduler's wake-ups; the step sums it).
  const std::int64_t largest = std::max<std::int64_t>(4 << 20, *std::max_element(w.bytes.begin(), w.bytes.end()));
  std::vector<std::int64_t> sizes{1 << 20, 4 << 20};
  if (largest > sizes.back()) sizes.push_back(largest);
  const int threads = std::max(1, w.threads);
  const int contention_reps = std::max(10, w.reps);
  nlohmann::json contention = nlohmann::json::array();
  double comm_alone = 0, comm_with_compute = 0;
  for (const std::string op : {"all_reduce", "all_gather"}) {
    for (std::int64_t bytes : sizes) {
      const std::int64_t elems = bytes / 4 / ctx.world_size * ctx.world_size;
      torch::Tensor full = torch::ones({elems});
      torch::Tensor part = torch::ones({elems / ctx.world_size});
      auto collective = [&] {
        if (op == "all_reduce") {
          comm.all_reduce(full, ReduceOp::kSum)->wait();
        } else {
          comm.all_gather(full, part)->wait();
        }
      };
      comm.barrier();
      const double alone = probe::mean_s(contention_reps, 1, collective);
      comm.barrier();
      double with_compute = 0;
      {
        std::atomic<bool> stop{false};
        std::thread side([&] {
          at::set_num_threads(threads);
          while (!stop.load()) step(side_mlp);
        });
        with_compute = probe::mean_s(contention_reps, 1, collective);
        stop.store(true);
        side.join();
      }
      comm.barrier();
      comm_alone += alone;
      comm_with_compute += with_compute;
      contention.push_back({{"op", op}, {"bytes", elems * 4}, {"alone_s", alone}, {"with_compute_s", with_compute}});
    }
  }
  torch::Tensor buf = torch::ones({largest / 4});
  auto all_reduce = [&] { comm.all_reduce(buf, ReduceOp::kSum)->wait(); };
  std::vector<double> samples;
  {
    // The same number of collectives on every rank (a count agreed in advance, not a time).
    const int collectives = 4 * reps;
    std::atomic<bool> done{false};
    std::thread side([&] {
      for (int i = 0; i < collectives; ++i) all_reduce();
      done.store(true);
    });
    once();
    while (!done.load()) {
      const auto t0 = probe::Clock::now();
      once();
      if (!done.load()) samples.push_back(probe::seconds_since(t0));
    }
    side.join();
  }
  comm.barrier();
  double compute_with_comm = 0;
  for (double v : samples) compute_with_comm += v / static_cast<double>(samples.size());
  out["contention"] = contention;
  out["contention_bytes"] = largest;
  out["comm_alone_s"] = comm_alone;
  out["comm_with_compute_s"] = comm_with_compute;
  out["compute_with_comm_s"] = compute_with_comm;
  out["compute_with_comm_samples"] = samples.size();
}

// Every op at every size (and the reducing ones with 16-bit elements), w.reps timed after w.warmup.
nlohmann::json time_collectives(Communicator& comm, const probe::WorkerSettings& w) {
  nlohmann::json timings = nlohmann::json::object();
  for (const std::string op : probe::kOps) {
    for (std::int64_t bytes : w.bytes) {
      const auto [used, t] = probe::time_collective(comm, op, bytes, w.reps, w.warmup);
      timings[op].push_back({{"bytes", used}, {"time_s", t}});
    }
  }
  // The reducing ops again with 16-bit elements (the plans' reduce_dtype): Gloo converts each element
  // to sum it, so their bytes go slower than fp32's.
  for (const std::string op : probe::kReduceOps) {
    for (const auto& [name, dtype] : probe::kReduceDtypes) {
      for (std::int64_t bytes : w.bytes) {
        const auto [used, t] = probe::time_collective(comm, op, bytes, w.reps, w.warmup, dtype);
        timings[op + "/" + name].push_back({{"bytes", used}, {"time_s", t}});
      }
    }
  }
  return timings;
}

}  // namespace

int run_collectives_worker() {
  std::unique_ptr<RankSession> session;
  RankContext ctx;
  try {
    const probe::WorkerSettings w = probe::worker_settings_from_env();
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
    for (const std::string op : probe::kOps)
      for (std::int64_t bytes : w.bytes) probe::time_collective(comm, op, bytes, 1, 0);
    for (const std::string op : probe::kReduceOps)
      for (const auto& [name, dtype] : probe::kReduceDtypes)
        for (std::int64_t bytes : w.bytes) probe::time_collective(comm, op, bytes, 1, 0, dtype);
    measure_contention(comm, ctx, w, out);
    out["timings"] = time_collectives(comm, w);
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

}  // namespace zeroplan::exec
