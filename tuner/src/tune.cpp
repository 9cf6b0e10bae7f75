// The search: enumerate, evaluate every candidate in a pool of threads, rank, explain.
#include "zeroplan/tuner/tune.h"

#include "zeroplan/tuner/exports.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

#include "zeroplan/profiles/errors.h"
#include "zeroplan/sim/errors.h"
#include "zeroplan/tuner/pareto.h"
#include "zeroplan/tuner/space.h"

namespace zeroplan::tuner {
namespace {

// Candidates are evaluated the most promising first: in order of their step-time lower bound (then their
// index), in rounds of 1, 2, 4, ... up to kRound. With pruning on, one is not simulated (Status::dominated)
// when the earlier rounds' outcomes already hold top_k fitting plans faster than its lower bound: it cannot
// enter the ranking (the Pareto front and the cloud of fitting points then hold the simulated plans only).
// Only earlier rounds count, so the result does not depend on the threads. Taking the lowest bounds first
// tightens the ranking's top_k early: a trillion-parameter GPT on 4,096 GPUs has thousands of candidates,
// most with bounds far above the best plans (a many-stage pipeline costs a second to simulate).
constexpr std::size_t kRound = 64;

std::vector<std::vector<std::size_t>> rounds(const std::vector<double>& bounds) {
  std::vector<std::pair<double, std::size_t>> by_bound;
  for (std::size_t i = 0; i < bounds.size(); ++i) by_bound.emplace_back(bounds[i], i);
  std::sort(by_bound.begin(), by_bound.end());
  std::vector<std::vector<std::size_t>> out;
  for (std::size_t k = 0, size = 1; k < by_bound.size(); k += size, size = std::min(2 * size, kRound)) {
    std::vector<std::size_t> round;
    for (std::size_t j = k; j < std::min(by_bound.size(), k + size); ++j) round.push_back(by_bound[j].second);
    out.push_back(std::move(round));
  }
  return out;
}

// The top_k-th fastest fitting step time so far (infinity when fewer fit): a candidate whose bound is above
// it cannot be ranked.
double kth_fastest(const std::vector<Outcome>& done, int top_k) {
  std::vector<double> times;
  for (const Outcome& o : done)
    if (o.status == Status::fits) times.push_back(o.prediction.step_time_s);
  const auto k = static_cast<std::size_t>(std::max(1, top_k));
  if (times.size() < k) return std::numeric_limits<double>::infinity();
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(k - 1), times.end());
  return times[k - 1];
}

// Each candidate's step-time bound, of its fastest variant (no units checkpointed where the fitter chooses
// them), on `threads` threads; 0 (no claim) where the plan cannot be bounded: its simulation says why.
std::vector<double> step_time_bounds(const std::vector<Candidate>& cands, const Evaluator& ev, int threads) {
  std::vector<double> bounds(cands.size(), 0.0);
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i = next.fetch_add(1); i < cands.size(); i = next.fetch_add(1)) {
      Plan fastest = cands[i].plan;
      if (cands[i].fit_checkpointing) {
        fastest.checkpointing = Checkpointing{};
        fastest.checkpoint_offload = false;
      }
      bounds[i] = ev.step_time_lower_bound(fastest);
    }
  };
  {
    std::vector<std::jthread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
  }
  return bounds;
}

// Evaluates every candidate; outcomes land at their candidate's index, so the result does not depend on
// the number of threads or the order they finish in.
std::vector<Outcome> evaluate_all(const std::vector<Candidate>& cands, const ModelProfile& model, const Evaluator& ev,
                                  const MemoryLimits& limits, const TuneOptions& opt) {
  std::vector<Outcome> out(cands.size());
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = std::clamp(opt.threads > 0 ? opt.threads : hw, 1, std::max(1, static_cast<int>(cands.size())));
  std::vector<std::size_t> order;  // this phase's candidates to simulate
  std::atomic<std::size_t> next{0};
  std::mutex progress_mutex;
  Progress progress;
  progress.total = static_cast<std::int64_t>(cands.size());
  const std::int64_t report_every = std::max<std::int64_t>(1, progress.total / 200);
  std::exception_ptr failure;
  std::mutex failure_mutex;
  SearchOptions sopt;
  sopt.prune = opt.prune;

  auto worker = [&] {
    for (;;) {
      const std::size_t k = next.fetch_add(1);
      if (k >= order.size()) return;
      const std::size_t i = order[k];
      try {
        out[i] = evaluate_candidate(cands[i], model, ev, limits, sopt);
      } catch (...) {
        std::lock_guard lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        next = order.size();
        return;
      }
      if (opt.progress) {
        std::lock_guard lock(progress_mutex);
        ++progress.done;
        progress.simulations += out[i].simulations;
        progress.fitting += out[i].status == Status::fits ? 1 : 0;
        if (progress.done % report_every == 0 || progress.done == progress.total) opt.progress(progress);
      }
    }
  };
  // Without pruning the order does not matter (every candidate is simulated): no bounds to compute.
  const std::vector<double> bounds = opt.prune ? step_time_bounds(cands, ev, threads) : std::vector<double>(cands.size(), 0.0);
  for (const std::vector<std::size_t>& round : rounds(bounds)) {
    order.clear();
    const double kth = opt.prune ? kth_fastest(out, opt.top_k) : std::numeric_limits<double>::infinity();
    sopt.rank_cutoff_s = kth;
    for (const std::size_t i : round) {
      if (kth < bounds[i]) {
        out[i].status = Status::dominated;
        out[i].plan = cands[i].plan;
        if (opt.progress) {
          std::lock_guard lock(progress_mutex);
          ++progress.done;
          if (progress.done % report_every == 0 || progress.done == progress.total) opt.progress(progress);
        }
      } else {
        order.push_back(i);
      }
    }
    next = 0;
    if (threads == 1 || order.size() <= 1) {
      worker();
    } else {
      std::vector<std::jthread> pool;
      pool.reserve(static_cast<std::size_t>(threads));
      for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
    }
    if (failure) std::rethrow_exception(failure);
  }
  return out;
}

DefaultCheck check_default(const TuneResult& r, const Evaluator& ev) {
  DefaultCheck d;
  d.device_available_bytes = r.limits.device_bytes;
  d.host_available_bytes = r.limits.host_bytes;
  try {
    d.plan = Plan::default_ddp(r.world_size, r.constraints.global_batch);
    d.plan.optimizer.name = r.constraints.optimizer;
    validate(d.plan, r.model);
    d.valid = true;
  } catch (const SchemaError& e) {
    d.invalid_reason = e.what();
    return d;
  }
  try {
    d.prediction = ev.simulate(d.plan);
    d.simulated = true;
    d.fits = fits(d.prediction, r.limits);
    d.device_needed_bytes = d.prediction.device.total_bytes();
    d.host_needed_bytes = d.prediction.host.total_bytes();
  } catch (const SchemaError& e) {
    d.error = e.what();
  } catch (const sim::SimError& e) {
    d.error = e.what();
  }
  return d;
}

}  // namespace

std::int64_t Rejections::invalid_total() const {
  std::int64_t n = 0;
  for (const auto& [why, count] : invalid) n += count;
  return n;
}

TuneResult tune(const ModelProfile& model, const ClusterProfile& cluster_in, const TuneConstraints& constraints,
                const TuneOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  TuneResult r;
  r.model = model;
  r.cluster = constrained_cluster(cluster_in, constraints);
  r.constraints = constraints;
  if (constraints.for_tool == "accelerate" && r.cluster.device.kind == "cpu")
    throw Error(ErrorKind::not_possible_here,
                fmt::format("--for accelerate: the cluster {} is of CPUs, and {}", r.cluster.name, kAccelerateNeedsAccelerators));
  Space space = enumerate_space(model, r.cluster, constraints);
  r.limits = memory_limits(r.cluster, constraints, space.world_size);
  r.world_size = space.world_size;
  r.nodes_used = space.nodes_used;
  r.notes = space.notes;
  r.rejections.invalid = space.invalid;
  r.candidates = static_cast<std::int64_t>(space.candidates.size());

  std::unique_ptr<Evaluator> owned;
  const Evaluator* ev = options.evaluator;
  if (!ev) {
    owned = make_simulator(model, r.cluster);
    ev = owned.get();
  }
  // --for TOOL: the tool's memory where it holds more than zeroplan's executor (DeepSpeed's ZeRO-3 partitions).
  std::unique_ptr<Evaluator> tool_memory;
  if (!constraints.for_tool.empty()) {
    tool_memory = with_tool_memory(*ev, constraints.for_tool, model);
    ev = tool_memory.get();
  }
  // --for TOOL: a candidate whose plan the tool cannot express is not simulated, and no fitted variant it
  // cannot express (a partial activation offload, a subset of checkpointed units) is ranked.
  const auto expressible = [&](const Plan& p) { return expressible_by(constraints.for_tool, p, model, r.cluster); };
  if (!constraints.for_tool.empty()) {
    const std::string why = "not expressible by " + constraints.for_tool;
    std::vector<Candidate> kept;
    for (Candidate& c : space.candidates) {
      if (!expressible(c.plan)) {
        ++r.rejections.invalid[why];
        continue;
      }
      c.fit_activations = false;  // no tool here offloads a share of the activations
      kept.push_back(std::move(c));
    }
    space.candidates = std::move(kept);
  }
  std::vector<Outcome> outcomes = evaluate_all(space.candidates, model, *ev, r.limits, options);
  if (!constraints.for_tool.empty()) {
    for (Outcome& o : outcomes) {
      if (o.status == Status::fits && !expressible(o.plan)) {
        o.status = Status::error;
        o.error = fmt::format("the variant that fits is not expressible by {}", constraints.for_tool);
      }
    }
  }

  std::vector<int> fitting;
  std::vector<int> misses;
  for (int i = 0; i < static_cast<int>(outcomes.size()); ++i) {
    const Outcome& o = outcomes[static_cast<std::size_t>(i)];
    r.simulations += o.simulations;
    r.bound_prunes += o.bound_prunes;
    switch (o.status) {
      case Status::fits: fitting.push_back(i); break;
      case Status::out_of_memory_bound: ++r.rejections.out_of_memory_bound; misses.push_back(i); break;
      case Status::out_of_memory: ++r.rejections.out_of_memory; misses.push_back(i); break;
      case Status::error:
        ++r.rejections.errors;
        ++r.rejections.error_messages[o.error];
        break;
      case Status::dominated: ++r.rejections.dominated; break;
    }
  }
  r.fitting = static_cast<std::int64_t>(fitting.size());
  auto at = [&](int i) -> const Outcome& { return outcomes[static_cast<std::size_t>(i)]; };
  auto ranked = [&](int i) { return RankedPlan{i, at(i).plan, at(i).prediction, 0, {}}; };

  // Ranking: fastest first; ties by memory, then by enumeration order. A plan that predicts exactly what
  // a ranked one predicts (step time, device and host totals) is folded into it: `faster` orders by
  // exactly these, so such plans sort next to each other.
  std::vector<int> order = fitting;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return faster(at(a).prediction, at(b).prediction); });
  const std::size_t k = static_cast<std::size_t>(std::max(0, options.top_k));
  for (std::size_t i = 0; i < order.size(); ++i) {
    const Outcome& o = at(order[i]);
    RankedPlan* same = r.ranking.empty() ? nullptr : &r.ranking.back();
    if (same != nullptr && !faster(same->prediction, o.prediction)) {  // `faster` orders them: equal
      const std::vector<std::string> knobs = differing_knobs(same->plan, o.plan);
      if (knobs.empty()) continue;  // two candidates that became the same plan: not a variant
      same->equivalents += 1;
      for (const std::string& knob : knobs)
        if (std::find(same->equivalent_knobs.begin(), same->equivalent_knobs.end(), knob) == same->equivalent_knobs.end())
          same->equivalent_knobs.push_back(knob);
      std::sort(same->equivalent_knobs.begin(), same->equivalent_knobs.end());
      continue;
    }
    if (r.ranking.size() == k) break;
    r.ranking.push_back(ranked(order[i]));
  }

  // Pareto front and the cloud of fitting points.
  std::vector<ParetoPoint> points;
  for (int i : fitting) {
    const Prediction& p = at(i).prediction;
    points.push_back({i, p.device.total_bytes(), p.samples_per_s});
    r.fitting_points.push_back({i, p.device.total_bytes(), p.samples_per_s});
  }
  for (int id : pareto_front(points)) r.pareto.push_back(ranked(id));

  // The closest misses.
  std::stable_sort(misses.begin(), misses.end(), [&](int a, int b) {
    return at(a).device_excess_bytes + at(a).host_excess_bytes < at(b).device_excess_bytes + at(b).host_excess_bytes;
  });
  for (std::size_t i = 0; i < std::min<std::size_t>(5, misses.size()); ++i) {
    const Outcome& o = at(misses[i]);
    r.rejections.closest.push_back({misses[i], o.status, o.plan, o.device_excess_bytes, o.host_excess_bytes, o.error});
  }

  r.default_plan = check_default(r, *ev);
  if (options.explain && r.best()) {
    const RankedPlan& w = *r.best();
    if (r.ranking.size() > 1)
      r.explanation.comparisons.push_back(
          compare_plans("runner-up", w.plan, w.prediction, r.ranking[1].plan, &r.ranking[1].prediction, *ev, r.limits));
    if (r.default_plan.valid)
      r.explanation.comparisons.push_back(compare_plans("default", w.plan, w.prediction, r.default_plan.plan,
                                                        r.default_plan.simulated ? &r.default_plan.prediction : nullptr, *ev,
                                                        r.limits));
  }
  r.wall_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace zeroplan::tuner
