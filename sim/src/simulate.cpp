// simulate(): validate, lower, run, and turn the result into a Prediction, a trace and an explanation.
#include "zeroplan/sim/simulate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "lowering/context.h"
#include "zeroplan/sim/graph.h"
#include "zeroplan/sim/trace.h"

namespace zeroplan::sim {

namespace {

using Interval = std::pair<double, double>;

// The intervals of the tasks on communication and on compute resources, each list sorted, into `comm`
// and `compute`. A resource's tasks in id order are in start order almost always (it runs them one after
// another): each resource's run is sorted only when it is not, and the runs merged (the whole list sorted
// cost a twentieth of a GPT-3 step's simulation). One pass over the tasks for both kinds; the lists are
// the caller's, kept between simulations.
void sorted_intervals(const TaskGraph& g, const SimResult& r, std::vector<std::vector<Interval>>& runs,
                      std::vector<Interval>& comm, std::vector<Interval>& compute) {
  const auto& resources = g.resources();
  comm.clear();
  compute.clear();
  runs.resize(std::max(runs.size(), resources.size()));
  bool any = false;
  for (std::size_t i = 0; i < resources.size(); ++i) {
    runs[i].clear();
    if (resources[i].kind != ResourceKind::comm && resources[i].kind != ResourceKind::compute) continue;
    runs[i].reserve(r.resources[i].tasks);
    any = true;
  }
  if (!any) return;
  const auto& tasks = g.tasks();
  for (TaskId t = 0; t < tasks.size(); ++t) {
    const ResourceKind k = resources[tasks[t].resource].kind;
    if (k == ResourceKind::comm || k == ResourceKind::compute) runs[tasks[t].resource].emplace_back(r.start_s[t], r.end_s[t]);
  }
  for (std::size_t i = 0; i < resources.size(); ++i) {
    std::vector<Interval>& run = runs[i];
    if (run.empty()) continue;
    std::vector<Interval>& to = resources[i].kind == ResourceKind::comm ? comm : compute;
    if (!std::is_sorted(run.begin(), run.end())) std::sort(run.begin(), run.end());
    const auto mid = static_cast<std::ptrdiff_t>(to.size());
    to.insert(to.end(), run.begin(), run.end());
    if (mid > 0) std::inplace_merge(to.begin(), to.begin() + mid, to.end());
  }
}

// The union of `v`, sorted (REQUIRES: v sorted), as disjoint intervals in order, into `out`.
void merged(const std::vector<Interval>& v, std::vector<Interval>& out) {
  out.clear();
  for (const Interval& i : v) {
    if (i.second <= i.first) continue;
    if (!out.empty() && i.first <= out.back().second) {
      out.back().second = std::max(out.back().second, i.second);
    } else {
      out.push_back(i);
    }
  }
}

double length(const std::vector<Interval>& v) {
  double s = 0;
  for (const Interval& i : v) s += i.second - i.first;
  return s;
}

double overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double s = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) s += hi - lo;
    (a[i].second < b[j].second ? i : j) += 1;
  }
  return s;
}

// Allocator overhead: the caching allocator's reserved/allocated factor on a device pool; on a pinned
// host pool what its power-of-two blocks, live and cached, hold beyond the peak of the requested bytes.
PoolExplain explain_pool(const PoolResult& r, std::int64_t capacity, double overhead_factor) {
  PoolExplain e;
  e.pool = r.name;
  e.peak_bytes = r.peak_bytes;
  e.allocator_overhead_bytes = static_cast<std::int64_t>(std::llround(static_cast<double>(r.peak_bytes) * (overhead_factor - 1))) +
                               std::max<std::int64_t>(0, r.reserved_bytes - r.peak_bytes);
  e.capacity_bytes = capacity;
  e.at_s = r.peak_time_s;
  e.by_category = r.peak_by_category;
  e.by_category[static_cast<std::size_t>(MemCategory::overhead)] += e.allocator_overhead_bytes;
  e.items = r.resident_at_peak;
  if (e.allocator_overhead_bytes > 0) {
    e.items.push_back({MemCategory::overhead, "allocator overhead", e.allocator_overhead_bytes, 1});
  }
  return e;
}

PoolPeak pool_peak(const PoolExplain& e) {
  PoolPeak p;
  p.peak_bytes = e.peak_bytes;
  p.allocator_overhead_bytes = e.allocator_overhead_bytes;
  p.capacity_bytes = e.capacity_bytes;
  p.at_s = e.at_s;
  for (const ResidentItem& i : e.items) {
    if (i.category == MemCategory::overhead && i.name == "allocator overhead") continue;  // reported separately
    p.resident.push_back({std::string(to_string(i.category)), i.name, i.bytes});
  }
  std::stable_sort(p.resident.begin(), p.resident.end(), [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  return p;
}

}  // namespace

std::int64_t PoolExplain::model_state_bytes() const {
  return by_category[static_cast<std::size_t>(MemCategory::params)] +
         by_category[static_cast<std::size_t>(MemCategory::grads)] +
         by_category[static_cast<std::size_t>(MemCategory::optimizer)];
}

namespace {

// The whole step; a pipelined plan's stages each have their resources and pools (their list returned).
std::vector<lowering::PipelineStage> lower_into(lowering::Ctx& c) {
  if (c.plan.pipeline_stages > 1) return lowering::schedule_pipeline(c);
  lowering::build_resources(c);
  lowering::place_model_states(c);
  if (c.plan.offload_model.enabled) {
    lowering::schedule_offload_model(c);
  } else {
    lowering::schedule_step(c);
  }
  return {};
}

// Per stage peaks and busy time; the device and host peaks are the largest stage's; the bubble.
// Returns the stage whose device peak is the largest.
std::size_t pipeline_results(const std::vector<lowering::PipelineStage>& stages, const SimResult& r,
                             const ClusterProfile& cluster, Simulation& s) {
  Prediction& p = s.prediction;
  double first = std::numeric_limits<double>::infinity(), last = 0, busy = 0;
  std::size_t worst_device = 0, worst_host = 0;
  // A pinned host pool's stage with the most blocks may not be the one with the most bytes requested.
  auto host_total = [&](std::size_t i) {
    const PoolResult& h = r.pools[stages[i].host];
    return std::max(h.peak_bytes, h.reserved_bytes);
  };
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const lowering::PipelineStage& st = stages[i];
    StagePrediction sp;
    sp.first_unit = st.first_unit;
    sp.units = st.units;
    const PoolExplain dev = explain_pool(r.pools[st.dev], cluster.device.mem_bytes, cluster.allocator_overhead_factor);
    sp.device = pool_peak(dev);
    sp.host_peak_bytes = r.pools[st.host].peak_bytes;
    for (const TaskId t : st.work) {
      sp.compute_busy_s += r.end_s[t] - r.start_s[t];
      first = std::min(first, r.start_s[t]);
      last = std::max(last, r.end_s[t]);
    }
    busy += sp.compute_busy_s;
    if (i == 0 || sp.device.total_bytes() > p.stages[worst_device].device.total_bytes()) worst_device = i;
    if (i == 0 || host_total(i) > host_total(worst_host)) worst_host = i;
    p.stages.push_back(std::move(sp));
  }
  const double span = last - first;
  p.bubble_fraction = span > 0 ? std::clamp(1 - busy / (static_cast<double>(stages.size()) * span), 0.0, 1.0) : 0.0;
  s.explain.device = explain_pool(r.pools[stages[worst_device].dev], cluster.device.mem_bytes, cluster.allocator_overhead_factor);
  s.explain.host = explain_pool(r.pools[stages[worst_host].host], cluster.host.mem_bytes, 1.0);
  p.notes.push_back(fmt::format("pipeline: {} stages, schedule {}, checkpoint {}; bubble {:.1f}% of the stages' time; the "
                                "device peak is stage {}'s",
                                stages.size(), p.plan.pipeline.schedule, p.plan.pipeline.checkpoint, 100 * p.bubble_fraction,
                                worst_device));
  return worst_device;
}

// The model states of `units` (the model, or a pipeline stage) as the lowering places them for the step.
ModelStates model_states(const Plan& plan, const ClusterProfile& cluster, const std::vector<lowering::Unit>& units) {
  const lowering::Residency r = lowering::model_state_residency(plan, cluster, units);
  ModelStates m;
  m.device_params = r.dev_params;
  m.device_grads = r.dev_grads;
  m.device_optimizer = r.dev_optimizer + r.dev_slowmo;
  m.host_params = r.host_params;
  m.host_grads = r.host_grads;
  m.host_optimizer = r.host_optimizer;
  return m;
}

}  // namespace

TaskGraph lower_step(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan, const SimOptions& options) {
  validate(plan);
  validate(plan, model);
  lowering::Ctx c(model, cluster, plan, options);
  lower_into(c);
  return std::move(c.g);
}

Simulation simulate_step(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan,
                         const SimOptions& options) {
  validate(plan);
  validate(plan, model);
  lowering::Ctx c(model, cluster, plan, options);
  const std::vector<lowering::PipelineStage> stages = lower_into(c);
  Simulation s;
  s.result = run(c.g, options.check_cycles);
  const SimResult& r = s.result;
  const lowering::SyncAmortisation sync = lowering::localsgd_amortisation(c);
  s.sync_extra_s = sync.sync_extra_s;

  Prediction& p = s.prediction;
  p.model = model.name;
  p.cluster = cluster.name;
  p.plan = plan;
  p.step_time_s = r.makespan_s + sync.amortised_extra_s;
  p.sync_step_time_s = r.makespan_s + sync.sync_extra_s;
  p.samples_per_s = plan.global_batch / p.step_time_s;
  p.lower_bound_s = std::min(makespan_lower_bound(c.g, r), p.step_time_s);

  if (stages.empty()) {
    s.explain.device = explain_pool(r.pools[c.dev], cluster.device.mem_bytes, cluster.allocator_overhead_factor);
    s.explain.host = explain_pool(r.pools[c.host], cluster.host.mem_bytes, 1.0);
    p.model_states = model_states(plan, cluster, c.units);
  } else {
    const lowering::PipelineStage& worst = stages[pipeline_results(stages, r, cluster, s)];
    const auto first = c.units.begin() + worst.first_unit;
    p.model_states = model_states(plan, cluster, std::vector<lowering::Unit>(first, first + worst.units));
  }
  p.device = pool_peak(s.explain.device);
  p.host = pool_peak(s.explain.host);

  // Time per resource, exposed vs overlapped communication, what bounds the step.
  {
    // Lists kept per thread between simulations (the tuner runs thousands on each).
    thread_local std::vector<std::vector<Interval>> runs;
    thread_local std::vector<Interval> comm_all, compute_all, comm, compute;
    sorted_intervals(c.g, r, runs, comm_all, compute_all);
    merged(comm_all, comm);
    merged(compute_all, compute);
    p.overlapped_comm_s = overlap(comm, compute);
    p.exposed_comm_s = std::max(0.0, length(comm) - p.overlapped_comm_s);
  }
  double best = -1;
  for (std::size_t i = 0; i < r.resources.size(); ++i) {
    const ResourceResult& rr = r.resources[i];
    if (rr.tasks == 0) continue;
    if (stages.empty()) {
      p.resource_busy_s[rr.name] += rr.busy_s;
    } else if (rr.name.rfind("p2p.", 0) != 0) {  // a stage's "s<k>.<resource>": the busiest stage's
      double& b = p.resource_busy_s[rr.name.substr(rr.name.find('.') + 1)];
      b = std::max(b, rr.busy_s);
    } else {
      double& b = p.resource_busy_s["p2p"];
      b = std::max(b, rr.busy_s);
    }
    const ResourceKind k = c.g.resources()[i].kind;
    const char* what = k == ResourceKind::compute          ? "compute"
                       : k == ResourceKind::comm           ? "communication"
                       : k == ResourceKind::host_optimizer ? "host_optimizer"
                                                           : "copies";
    if (rr.busy_s > best) {
      best = rr.busy_s;
      p.bound = what;
    }
  }
  if (p.bound.empty()) p.bound = "compute";
  p.units.reserve(c.units.size());
  for (std::size_t u = 0; u < c.units.size(); ++u) {
    UnitTiming ut;
    ut.name = c.unit_name(static_cast<int>(u));
    if (c.fwd0[u] != kNone) {
      ut.fwd_start_s = r.start_s[c.fwd0[u]];
      ut.fwd_s = r.end_s[c.fwd0[u]] - r.start_s[c.fwd0[u]];
    }
    if (c.bwd0[u] != kNone) {
      ut.bwd_start_s = r.start_s[c.bwd0[u]];
      ut.bwd_s = r.end_s[c.bwd0[u]] - r.start_s[c.bwd0[u]];
    }
    p.units.push_back(std::move(ut));
  }
  // A micro batch the profile did not measure: its unit figures come from the batch fits.
  if (model.measured && !model.profiled_batches.empty()) {
    const int lo = model.profiled_batches.front(), hi = model.profiled_batches.back();
    if (plan.micro_batch < lo || plan.micro_batch > hi) {
      c.notes.push_back(fmt::format("micro batch {} is outside the profiled batches {}..{}: its unit times and memory "
                                    "are extrapolated from the batch fits",
                                    plan.micro_batch, lo, hi));
    }
  }
  // LocalSGD warm-up (PostLocalSGDOptimizer): plain DDP steps before the first local one, a one-off that
  // step_time_s (the steady state) leaves out; their time is that of the same plan without LocalSGD.
  if (plan.localsgd() && plan.localsgd_warmup_steps > 0) {
    Plan ddp = plan;
    ddp.localsgd_frequency = ddp.localsgd_warmup_steps = ddp.slowmo_frequency = 0;
    ddp.slowmo_momentum = 0;
    ddp.slowmo_lr = 1;
    const double warm_s = simulate_step(model, cluster, ddp, options).prediction.step_time_s;
    c.notes.push_back(fmt::format("LocalSGD warm-up: the first {} steps reduce gradients across all {} ranks, {:.6f} s "
                                  "each ({:+.6f} s against step_time_s): a one-off {:.6f} s, not in step_time_s",
                                  plan.localsgd_warmup_steps, c.n, warm_s, warm_s - p.step_time_s,
                                  plan.localsgd_warmup_steps * (warm_s - p.step_time_s)));
  }
  // A plan computing in another dtype than the profile's, on the device kind it was measured on: its unit
  // times come from times measured at that dtype where the profile has them, else from the profile's own
  // scaled by the ratio of the device's peaks, which the user should know.
  if (measured_on_device_kind(model, cluster) && model.dtype != plan.precision.compute_dtype) {
    std::vector<std::string> scaled;
    for (const UnitProfile& u : model.units)
      if (!u.times_at_dtype.contains(plan.precision.compute_dtype) && u.time_fwd_s.value + u.time_bwd_s.value > 0)
        scaled.push_back(u.name);
    if (!scaled.empty())
      c.notes.push_back(fmt::format("compute in {} predicted from the profile's {} times scaled by the ratio of peaks "
                                    "for {} of {} units (no times measured at {}: profile with --dtype {})",
                                    plan.precision.compute_dtype, model.dtype, scaled.size(), model.units.size(),
                                    plan.precision.compute_dtype, plan.precision.compute_dtype));
    else
      c.notes.push_back(fmt::format("compute in {}: the unit times measured at {} (times_at_dtype)",
                                    plan.precision.compute_dtype, plan.precision.compute_dtype));
  }
  if (cluster.allocator_overhead_factor > 1) {
    c.notes.push_back(fmt::format("device allocator overhead factor {} reported separately from peak_bytes",
                                  cluster.allocator_overhead_factor));
  }
  p.notes.insert(p.notes.begin(), c.notes.begin(), c.notes.end());
  s.graph = std::move(c.g);
  return s;
}

Prediction simulate(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan, const SimOptions& options) {
  return simulate_step(model, cluster, plan, options).prediction;
}

std::string Simulation::trace_json() const { return chrome_trace_json(graph, result); }

std::string Simulation::explain_text() const {
  std::string out;
  auto gb = [](std::int64_t b) { return static_cast<double>(b) / 1e9; };
  for (const PoolExplain* e : {&explain.device, &explain.host}) {
    out += fmt::format("{} peak {:.3f} GB at {:.6f} s (+{:.3f} GB allocator overhead; capacity {:.3f} GB)\n", e->pool,
                       gb(e->peak_bytes), e->at_s, gb(e->allocator_overhead_bytes), gb(e->capacity_bytes));
    for (int cat = 0; cat < kNumMemCategories; ++cat) {
      const auto mc = static_cast<MemCategory>(cat);
      out += fmt::format("  {:<12} {:>10.3f} GB\n", to_string(mc), gb(e->by_category[static_cast<std::size_t>(cat)]));
      for (const ResidentItem& i : e->items) {
        if (i.category != mc) continue;
        out += fmt::format("    {:<28} {:>10.3f} GB  x{}\n", i.name, gb(i.bytes), i.count);
      }
    }
  }
  return out;
}

}  // namespace zeroplan::sim
