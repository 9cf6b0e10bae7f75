// step_time_lower_bound: a lower bound of simulate()'s step time from the plan's compute and collectives,
// without a task graph, for the tuner's pruning (memory_bound.h).
//
// Why it is a lower bound: the engine runs each resource's tasks one at a time in the order they were
// added, none before its dependencies end, each at most at its stand-alone speed (a shared group only
// slows its members, rank skew only delays), so
//  - the makespan is at least any one resource's summed task durations (the compute stream's forwards
//    and backwards; the collectives' stream), and
//  - a replay of a subset of a stream's tasks in the same order, with a subset of their dependencies,
//    ends no later than the tasks do (the pipelines' stages below).
// step_time_s adds LocalSGD's amortised averaging to the makespan; so does the bound. Checkpointed units add
// their recompute. Checkpoint offload only adds copies, which the bound leaves out; so does activation offload
// in plans without pipeline stages. In a pipeline stage a unit's activation-offload copies stand between
// compute tasks (activations.cpp): the next forward waits for a unit's copies out (which start after the
// previous unit's forward, or the unit's own for the stage's first), and a unit's backward for its copies
// back (which start after the next unit's backward; for the stage's last unit after the stage's previous
// task and, but on the last stage, the next stage's backward): the replay runs those copies too, each at
// its stand-alone time, where the profile lists no saved tensors (lowering::analytic_offloaded_bytes; the
// model's first unit's left out). Longer copies never end a replay earlier, so the bound never falls as the
// ratio rises.
#include <algorithm>

#include "lowering/context.h"
#include "zeroplan/profiles/pipeline.h"
#include "zeroplan/sim/cost_models.h"
#include "zeroplan/sim/memory_bound.h"

namespace zeroplan::sim {

namespace {

// The collectives of a plan without pipeline stages (dp_sync.cpp, params_residency.cpp, optimizer_step.cpp),
// per stream: stages 0-1 all-reduce every gradient once (LocalSGD: within the node), stage 1 then
// all-gathers the updated parameters; stage 2 reduce-scatters every gradient in every microbatch, then
// all-gathers the parameters, on the same stream; stage 3 gathers every unit's parameters before each
// microbatch's forward (and, resharded, before its backward) on one stream and reduce-scatters its gradient
// every microbatch on another. Each as the cheapest split of its bytes (collective_time_lower_bound).
double flat_comm_bound(const Plan& plan, const ClusterProfile& cluster, const std::vector<lowering::Unit>& units) {
  const int n = plan.data_parallel_size();
  if (n <= 1) return 0.0;
  const lowering::Bytes b = lowering::bytes_of(plan);
  const int wire = plan.precision.fp32_reduce_scatter ? 4 : b.reduce;
  const std::string reduce_dtype = plan.precision.fp32_reduce_scatter ? "fp32" : plan.precision.reduce_dtype;
  const int sync = plan.precision.broadcast_fp16 ? 2 : b.param;
  double params = 0, padded = 0, gathered = 0;  // elements: all, padded (with parameters), gathered per microbatch
  for (std::size_t i = 0; i < units.size(); ++i) {
    const lowering::Unit& u = units[i];
    params += static_cast<double>(u.params);
    if (u.params > 0) padded += static_cast<double>(u.padded);
    gathered += static_cast<double>(u.padded);
    // Resharded after its forward and gathered again for its backward.
    if (plan.reshard_after_forward && !lowering::stays_gathered(units, i)) gathered += static_cast<double>(u.padded);
  }
  const double m = plan.microbatches;
  auto lb = [&](CollOp op, double bytes, int ranks, const std::string& dtype) {
    return collective_time_lower_bound(cluster, op, bytes, ranks, dtype);
  };
  const double param_sync = lb(CollOp::all_gather, padded * sync, n, "fp32");
  switch (plan.zero_stage) {
    case 0:
    case 1: {
      const int ranks = plan.localsgd() ? std::min(n, cluster.devices_per_node) : n;
      return lb(CollOp::all_reduce, params * wire, ranks, reduce_dtype) + (plan.zero_stage == 1 ? param_sync : 0.0);
    }
    case 2: return m * lb(CollOp::reduce_scatter, padded * wire, n, reduce_dtype) + param_sync;
    default:
      return std::max(m * lb(CollOp::all_gather, gathered * b.param, n, "fp32"),
                      m * lb(CollOp::reduce_scatter, padded * wire, n, reduce_dtype));
  }
}

// Pipelined plans: each stage's forwards, recomputes (pipeline-checkpointed microbatches) and backwards
// replayed in the stage's order (pipeline_order), a forward after the previous stage's forward of its
// microbatch, a backward after the next stage's backward of it, with the activation-offload copies that
// stand between a stage's compute tasks (above): sends, gathers, gradient reductions and optimizer steps
// free. Returns the last stage to finish, in unscaled compute seconds (copies divided by `factor`).
double pipeline_replay(const Plan& plan, const ModelProfile& model, const ClusterProfile& cluster,
                       const std::vector<lowering::Unit>& units, double factor) {
  const int p = plan.pipeline_stages, m = plan.microbatches;
  // Per stage, one microbatch: forward; the stage's recompute (pipeline-checkpointed microbatches); what
  // its backward runs before it needs the next stage's gradient (the last unit's recompute, when that unit
  // is checkpointed) and after (the backwards and the other checkpointed units' recomputes).
  std::vector<double> fwd, recompute, early, bwd;
  // Stages with activation-offload copies: a forward's end (its last unit's forward) and the end of the
  // copies out it waits for, from its start; each unit's copies back (0: none).
  std::vector<double> fwd_done, fwd_free;
  std::vector<std::vector<double>> back;
  const double ratio = plan.offload.activations_ratio;
  std::vector<std::size_t> firsts;
  std::size_t first = 0;
  for (const int n : pipeline_balance(plan, model)) {
    const std::size_t last = first + static_cast<std::size_t>(n) - 1;
    double f = 0, r = 0, b = 0;
    for (std::size_t i = first; i <= last; ++i) {
      f += units[i].fwd_s;
      r += units[i].recompute_s;
      b += units[i].bwd_s + (units[i].checkpoint && i != last ? units[i].recompute_s : 0.0);
    }
    fwd.push_back(f);
    recompute.push_back(r);
    early.push_back(units[last].checkpoint ? units[last].recompute_s : 0.0);
    bwd.push_back(b);
    std::vector<double> h2d(last - first + 1, 0.0);
    double done = f, free = f;
    if (ratio > 0 && factor > 0 && !units[first].tensor_list) {
      // The forward's chain: each unit's copies out after the previous unit's forward (the first's after its
      // own), one at a time; the next forward after them.
      double t = 0, prev_end = 0, d2h_free = 0;
      for (std::size_t i = first; i <= last; ++i) {
        const double end = t + units[i].fwd_s;
        t = end;
        const std::int64_t off = units[i].checkpoint || i == 0 ? 0 : lowering::analytic_offloaded_bytes(units[i], units[i - 1].output, ratio);
        if (off > 0) {
          const double start = std::max(i == first ? end : prev_end, d2h_free);
          d2h_free = start + copy_time(cluster, CopyDir::d2h, static_cast<double>(off)) / factor;
          t = std::max(end, d2h_free);
          h2d[i - first] = copy_time(cluster, CopyDir::h2d, static_cast<double>(off)) / factor;
        }
        prev_end = end;
      }
      done = prev_end;
      free = t;
    }
    fwd_done.push_back(done);
    fwd_free.push_back(free);
    const bool copies = std::any_of(h2d.begin(), h2d.end(), [](double c) { return c > 0; });
    back.push_back(copies ? std::move(h2d) : std::vector<double>{});
    firsts.push_back(first);
    first = last + 1;
  }
  std::vector<std::vector<PipelineOp>> order;
  for (int s = 0; s < p; ++s) order.push_back(pipeline_order(plan.pipeline.schedule, p, s, m));
  std::vector<char> checkpointed(static_cast<std::size_t>(m));
  for (int mb = 0; mb < m; ++mb) checkpointed[static_cast<std::size_t>(mb)] = pipeline_checkpointed(plan, mb);
  const auto at = [m](int s, int mb) { return static_cast<std::size_t>(s) * static_cast<std::size_t>(m) + static_cast<std::size_t>(mb); };
  std::vector<double> fwd_end(at(p, 0), -1.0), bwd_end(at(p, 0), -1.0);
  std::vector<double> free_at(static_cast<std::size_t>(p), 0.0);
  std::vector<double> work_at(static_cast<std::size_t>(p), 0.0);  // the stage's last forward, recompute or backward ends
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  std::vector<int> todo;  // stages that may advance
  for (int s = p - 1; s >= 0; --s) todo.push_back(s);
  while (!todo.empty()) {
    const int s = todo.back();
    todo.pop_back();
    const auto si = static_cast<std::size_t>(s);
    for (; next[si] < order[si].size(); ++next[si]) {
      const PipelineOp& op = order[si][next[si]];
      const bool ckpt = checkpointed[static_cast<std::size_t>(op.microbatch)] != 0;
      if (op.forward) {
        const double ready = s > 0 ? fwd_end[at(s - 1, op.microbatch)] : 0.0;
        if (ready < 0) break;  // the previous stage has not run it yet
        const double start = std::max(free_at[si], ready);
        if (ckpt || back[si].empty()) {
          free_at[si] = work_at[si] = fwd_end[at(s, op.microbatch)] = start + fwd[si];
        } else {
          work_at[si] = fwd_end[at(s, op.microbatch)] = start + fwd_done[si];
          free_at[si] = start + fwd_free[si];
        }
        if (s + 1 < p) todo.push_back(s + 1);
      } else {
        const double ready = s + 1 < p ? bwd_end[at(s + 1, op.microbatch)] : 0.0;
        if (ready < 0) break;
        if (ckpt || back[si].empty()) {
          const double own = free_at[si] + (ckpt ? recompute[si] : 0.0) + early[si];
          free_at[si] = work_at[si] = bwd_end[at(s, op.microbatch)] = std::max(own, ready) + bwd[si];
        } else {
          // Unit by unit from the last: a checkpointed one's recompute, an offloaded one's copies back (the
          // last's after the stage's previous task and the gradient, the others' after the next unit's
          // backward), then the backward.
          const std::vector<double>& h2d = back[si];
          const std::size_t n = h2d.size();
          double t = free_at[si], h2d_free = 0;
          for (std::size_t k = n; k-- > 0;) {
            const lowering::Unit& u = units[firsts[si] + k];
            double start = t;
            if (u.checkpoint) start += u.recompute_s;
            if (k + 1 == n) start = std::max(start, ready);
            if (h2d[k] > 0) {
              const double issue = std::max(k + 1 == n ? std::max(work_at[si], ready) : t, h2d_free);
              h2d_free = issue + h2d[k];
              start = std::max(start, h2d_free);
            }
            t = start + u.bwd_s;
          }
          free_at[si] = work_at[si] = bwd_end[at(s, op.microbatch)] = t;
        }
        if (s > 0) todo.push_back(s - 1);
      }
    }
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

}  // namespace

double step_time_lower_bound(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan) {
  const std::vector<lowering::Unit> units = lowering::expand_units(model, plan, &cluster);
  const double factor = compute_time_factor(model, cluster);
  double makespan = 0;
  if (plan.pipeline_stages > 1) {
    makespan = pipeline_replay(plan, model, cluster, units, factor) * factor;
  } else {
    // Every unit's forward, recompute (checkpointed) and backward of every microbatch on the one compute
    // stream (OffloadModel: of every chunk of it, recomputed with checkpoint_activation).
    const bool om = plan.offload_model.enabled;
    double compute = 0;
    for (const lowering::Unit& u : units) {
      const bool recomputed = om ? plan.offload_model.checkpoint_activation : u.checkpoint;
      compute += u.fwd_s + u.bwd_s + (recomputed ? u.recompute_s : 0.0);
    }
    compute *= plan.microbatches * (om ? plan.offload_model.microbatches : 1) * factor;
    // OffloadModel's all-reduces are its own (offload_model.cpp): only the compute is claimed.
    makespan = std::max(compute, om ? 0.0 : flat_comm_bound(plan, cluster, units));
  }
  const double bound = makespan + lowering::localsgd_amortisation(plan, cluster, units).amortised_extra_s;
  // Sums in another order than the engine's clock: a hair below, so rounding never lifts it above.
  return bound * (1 - 1e-9);
}

}  // namespace zeroplan::sim
