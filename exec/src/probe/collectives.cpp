// The probe's collectives: launches the workers once per world size, fits every op as alpha + beta x
// bytes, and reads the loopback links off the all_reduce fit.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "probe_parts.h"
#include "zeroplan/exec/launcher.h"

namespace zeroplan::exec {

AlphaBetaFit fit_alpha_beta(const std::vector<std::pair<double, double>>& points) {
  TORCH_INTERNAL_ASSERT(!points.empty());
  // Weighted least squares, w = 1/t^2 (relative error); bytes in MiB for conditioning.
  double s = 0, sx = 0, sxx = 0, st = 0, sxt = 0;
  for (const auto& [bytes, t] : points) {
    TORCH_INTERNAL_ASSERT(t > 0);
    const double w = 1.0 / (t * t), x = bytes / probe::kMiB;
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
  f.beta_s_per_byte = beta / probe::kMiB;
  double sq = 0;
  for (const auto& [bytes, t] : points) {
    const double e = (f.alpha_s + f.beta_s_per_byte * bytes - t) / t;
    sq += e * e;
  }
  f.residual = std::sqrt(sq / static_cast<double>(points.size()));
  return f;
}

namespace probe {
namespace {

nlohmann::json settings_json(const WorkerSettings& w) {
  return {{"bytes", w.bytes}, {"reps", w.reps}, {"warmup", w.warmup}, {"threads", w.threads}};
}

// The fits the probe makes, each with the worker's key for its timings: one per op (fp32 elements,
// used for any dtype), then the reducing ops' 16-bit fits ("all_reduce/bf16").
struct FitKey {
  std::string key, op, dtype;
};
std::vector<FitKey> fit_keys() {
  std::vector<FitKey> keys;
  for (const std::string op : kOps) keys.push_back({op, op, ""});
  for (const std::string op : kReduceOps)
    for (const auto& d : kReduceDtypes) keys.push_back({op + "/" + d.first, op, d.first});
  return keys;
}

struct CollectiveRun {
  std::map<std::string, std::vector<std::pair<double, double>>> points;  // op -> (bytes, trimmed mean s)
  std::vector<std::string> fallbacks;
  std::string backend = "gloo";  // the ranks' communicator: "gloo", or "shm" on one host (cpu_backend)
  int threads = 1;
  double compute_alone_s = 0;     // rank 0's median of a small MLP step, the other ranks idle
  double compute_together_s = 0;  // the same with every rank computing
  // Contention on the shared cores (every rank): an all_reduce of contention_bytes alone and with every
  // rank computing; the MLP step with an all_reduce in flight on every rank (0: no sample).
  double contention_bytes = 0, comm_alone_s = 0, comm_with_compute_s = 0, compute_with_comm_s = 0;
  int compute_with_comm_samples = 0;
  std::string contention;  // per op and size: "all_reduce 1048576 B 1.23 -> 2.34 ms"
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
  run.backend = j.at("backend").get<std::string>();
  run.compute_alone_s = j.at("compute_alone_s").get<double>();
  run.compute_together_s = j.at("compute_together_s").get<double>();
  run.contention_bytes = j.at("contention_bytes").get<double>();
  run.comm_alone_s = j.at("comm_alone_s").get<double>();
  run.comm_with_compute_s = j.at("comm_with_compute_s").get<double>();
  run.compute_with_comm_s = j.at("compute_with_comm_s").get<double>();
  run.compute_with_comm_samples = j.at("compute_with_comm_samples").get<int>();
  for (const auto& row : j.at("contention")) {
    run.contention += fmt::format("{}{} {} B {:.2f} -> {:.2f} ms", run.contention.empty() ? "" : ", ",
                                  row.at("op").get<std::string>(), row.at("bytes").get<std::int64_t>(),
                                  row.at("alone_s").get<double>() * 1e3, row.at("with_compute_s").get<double>() * 1e3);
  }
  run.fallbacks = j.at("fallbacks").get<std::vector<std::string>>();
  for (const auto& [op, rows] : j.at("timings").items())
    for (const auto& row : rows)
      run.points[op].emplace_back(row.at("bytes").get<double>(), row.at("time_s").get<double>());
  for (const FitKey& k : fit_keys()) {
    if (run.points[k.key].empty())
      throw ProbeError(fmt::format("collectives on {} ranks: rank 0 reported no timings for {} (in {})", n, k.key,
                                   r.output_dir));
  }
  std::error_code ec;
  fs::remove_all(r.output_dir, ec);  // kept when something went wrong, for the logs
  return run;
}

}  // namespace

void measure_collectives(ClusterProfile& c, const Context& x) {
  const ProbeOptions& o = x.options;
  const Sizes& s = x.sizes;
  const Machine& m = x.machine;
  const auto& progress = x.progress;
  auto measured = [&](const std::string& method) { return x.measured(method); };
  std::vector<int> sizes = o.world_sizes;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (int n : sizes) {
    WorkerSettings w{s.coll_bytes, s.coll_reps, s.coll_warmup, std::max(1, m.cores / n)};
    const CollectiveRun run = run_collectives(o, n, w);
    std::string line = fmt::format("collectives on {} ranks ({}, 127.0.0.1):", n, run.backend);
    for (const auto& [key, op, dtype] : fit_keys()) {
      const auto it = run.points.find(key);  // present: run_collectives checked
      const AlphaBetaFit fit = fit_alpha_beta(it->second);
      CollectiveFit f;
      f.op = op;
      f.backend = run.backend;
      f.algorithm = "ring";
      f.scope = "intra_node";
      f.dtype = dtype;
      f.world_sizes = {n};
      f.alpha_s = fit.alpha_s;
      f.beta_s_per_byte = fit.beta_s_per_byte;
      f.fit_residual = fit.residual;
      // The points the simulator interpolates: by size, each time at most the next larger size's (a
      // larger message is not faster: a slow time at a small size is a scheduler's hiccup).
      f.points = it->second;
      std::sort(f.points.begin(), f.points.end());
      f.points.erase(std::unique(f.points.begin(), f.points.end(),
                                 [](const auto& a, const auto& b) { return a.first == b.first; }),
                     f.points.end());
      for (std::size_t k = f.points.size(); k-- > 1;)
        f.points[k - 1].second = std::min(f.points[k - 1].second, f.points[k].second);
      f.min_bytes = static_cast<std::int64_t>(it->second.front().first);
      f.max_bytes = static_cast<std::int64_t>(it->second.back().first);
      std::string fallback;
      for (const std::string& fb : run.fallbacks)
        if (fb.rfind("gloo " + op, 0) == 0) fallback += "; what ran: " + fb;
      const std::string bytes_mean = op == "all_gather"       ? "the gathered output"
                                     : op == "reduce_scatter" ? "the full input"
                                                              : "the buffer";
      std::string times;
      for (const auto& [bytes, t] : it->second)
        times += fmt::format("{}{:.0f} B {:.1f} us", times.empty() ? "" : ", ", bytes, t * 1e6);
      c.provenance[fmt::format("collectives[{}]", c.collectives.size())] = measured(fmt::format(
          "{} of {} elements over Gloo on 127.0.0.1 with {} ranks started by launch_local ({} torch thread(s) each), "
          "rank 0's time to Work::wait (broadcast: rank 0 receives), each from cold caches after a barrier, mean of {} "
          "after {} warm-up without the slowest and fastest tenth, bytes = {}; fitted as alpha + beta x bytes by least "
          "squares on relative error to those means ({}); the means, each at most the next larger size's, kept as "
          "points the simulator interpolates{}",
          op, dtype.empty() ? "fp32" : dtype, n, run.threads, s.coll_reps, s.coll_warmup, bytes_mean, times,
          fallback));
      c.collectives.push_back(f);
      line += fmt::format(" {}{}{} {:.1f} us + {:.2f} GB/s (res {:.2f});", op, dtype.empty() ? "" : " ", dtype,
                          f.alpha_s * 1e6,
                          f.beta_s_per_byte > 0 ? 1e-9 / f.beta_s_per_byte : 0.0, f.fit_residual);
    }
    progress(line);
    // The smallest world size probed is the one the runs on this machine use first: its slowdown
    // calibrates every compute task (profiles are measured with one process running).
    // core_contention: the simulator applies compute_ranks_slowdown to profiles timed one rank alone,
    // and the other two wherever compute and a collective overlap. A ratio below 1 is noise: 1.
    if (n == sizes.front()) {
      auto ratio = [](double num, double den) { return num > 0 && den > 0 ? std::max(1.0, num / den) : 1.0; };
      CoreContention& cc = c.core_contention;
      cc.compute_ranks_slowdown = ratio(run.compute_together_s, run.compute_alone_s);
      cc.compute_with_comm_slowdown = ratio(run.compute_with_comm_s, run.compute_together_s);
      cc.comm_with_compute_slowdown = ratio(run.comm_with_compute_s, run.comm_alone_s);
      progress(fmt::format("cores shared by {} ranks: compute x{:.3f} with every rank computing (over one alone), "
                           "x{:.3f} more with an all_reduce in flight; collectives x{:.3f} with every rank computing",
                           n, cc.compute_ranks_slowdown, cc.compute_with_comm_slowdown, cc.comm_with_compute_slowdown));
      if (cc.measured()) {
        c.provenance["core_contention"] = measured(fmt::format(
            "rank 0's mean times on {} ranks ({} thread(s) each) of a small MLP forward + backward (512 x 256 -> "
            "1024 -> 256) and of Gloo collectives: compute_ranks_slowdown = the MLP with every rank computing at once "
            "({:.3f} ms) over the same with the others idle ({:.3f} ms); compute_with_comm_slowdown = the MLP on every "
            "rank while every rank has all_reduces of {:.0f} bytes in flight on another thread ({:.3f} ms, {} samples) "
            "over the MLP on every rank ({:.3f} ms); comm_with_compute_slowdown = the sum of the collectives' mean "
            "times while every rank computes the MLP on another thread ({:.3f} ms) over their sum alone ({:.3f} ms) "
            "(alone -> with compute: {}); ratios below 1 recorded as 1",
            n, run.threads, run.compute_together_s * 1e3, run.compute_alone_s * 1e3, run.contention_bytes,
            run.compute_with_comm_s * 1e3, run.compute_with_comm_samples, run.compute_together_s * 1e3,
            run.comm_with_compute_s * 1e3, run.comm_alone_s * 1e3, run.contention));
      }
    }
  }
}

void record_links(ClusterProfile& c, const Context& x) {
  auto measured = [&](const std::string& method) { return x.measured(method); };
  if (x.options.collectives) {
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
}

}  // namespace probe
}  // namespace zeroplan::exec
