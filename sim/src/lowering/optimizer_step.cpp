// The optimizer step: on the device over this rank's shard (memory-bound on a GPU; the host rates on a
// CPU device), or on the host (offloaded optimizer) per final gradient as it arrives, overlapping the
// backward, followed by the H2D of the updated parameters. Flat parameters make it one launch instead
// of one per tensor. Stages 1-2 then all-gather the updated parameters.
#include <algorithm>
#include <cmath>

#include "context.h"
#include "zeroplan/profiles/pipeline.h"
#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim::lowering {

namespace {

// A memory-bound copy of `elems` elements on the device (a cast when the sizes differ): read + write at
// the memory bandwidth, one launch.
double device_copy_s(const Ctx& c, std::int64_t elems, int from_bytes, int to_bytes) {
  return static_cast<double>(elems) * (from_bytes + to_bytes) / c.cluster.device.mem_bw_bytes_per_s +
         c.cluster.device.launch_overhead_s;
}

}  // namespace

void param_sync(Ctx& c, const std::vector<TaskId>& after) {
  if (c.plan.zero_stage == 0 || c.plan.zero_stage == 3 || c.n <= 1) return;
  const int sync = c.plan.precision.broadcast_fp16 ? 2 : c.b.param;
  const bool cast = sync != c.b.param;
  // A device fp32 master is rounded into each unit's chunk before it travels (the executor's
  // updated_chunk); an offloaded one came back by its H2D (`after`).
  const bool device_master = c.b.master > 0 && !c.plan.offload.optimizer;
  CollectiveOptions o;
  o.algo = c.opt.collective_algo;
  std::vector<std::int64_t> gathered;
  for (const Unit& u : c.units) gathered.push_back(u.params > 0 ? u.padded * sync : 0);
  auto after_all = [&](TaskId t) {
    for (TaskId a : after) c.g.add_dep(t, a);
    return t;
  };
  for (const std::vector<int>& bucket : allgather_buckets(gathered, c.plan.buckets.allgather_bucket_bytes)) {
    const int first = bucket.front();
    if (bucket.size() == 1 && !cast) {  // in place
      const Unit& u = c.units[static_cast<std::size_t>(first)];
      TaskId rounded = kNone;
      if (device_master) rounded = after_all(c.compute_task(device_copy_s(c, u.shard, 4, c.b.param), c.n_cast, first, -1));
      const double s = collective_time(c.cluster, CollOp::all_gather, static_cast<double>(u.padded * sync), c.n, o);
      const TaskId ag = after_all(c.g.add_task(c.comm, s, c.label(c.n_param_sync, first, -1), {}, c.n_cat_comm));
      c.g.add_dep(ag, rounded);
      continue;
    }
    // Staged: every unit's chunk copied (rounded) into this rank's row of one buffer, gathered in place,
    // copied out to the units.
    std::int64_t staged = 0;
    for (const int u : bucket) staged += c.units[static_cast<std::size_t>(u)].shard;
    const double in_s = device_copy_s(c, staged, device_master ? 4 : c.b.param, sync) +
                        c.cluster.device.launch_overhead_s * static_cast<double>(bucket.size() - 1);
    const TaskId fill = after_all(c.compute_task(in_s, c.n_cast, first, -1));
    const double s = collective_time(c.cluster, CollOp::all_gather, static_cast<double>(c.n * staged * sync), c.n, o);
    const TaskId ag = c.g.add_task(c.comm, s, c.label(c.n_param_sync, first, -1), {fill}, c.n_cat_comm);
    const double out_s = device_copy_s(c, c.n * staged, sync, c.b.param) +
                         c.cluster.device.launch_overhead_s * static_cast<double>(bucket.size() - 1);
    const TaskId unstage = c.compute_task(out_s, c.n_cast, bucket.back(), -1);
    c.g.add_dep(unstage, ag);
    c.g.alloc(fill, c.dev, c.n * staged * sync, MemCategory::buffers, c.label(c.n_gather_bucket), unstage);
  }
}

namespace {
// The elements of the largest unit the rank steps (stage 0: whole units, else shards): the fp32 copy of one
// unit's gradient that step_master_by_unit holds at a time beside a 16-bit model.
std::int64_t largest_step_unit(const Ctx& c) {
  std::int64_t largest = 0;
  for (const Unit& u : c.units) largest = std::max(largest, c.plan.zero_stage == 0 ? u.params : u.shard);
  return largest;
}
}  // namespace

void optimizer_step(Ctx& c, GradSync& grads) {
  const TaskId gate = loss_scale_check(c, grads);
  const std::string& name = c.plan.optimizer.name;
  const bool flat = c.plan.flat_params;
  std::int64_t local = 0;
  for (const GradDone& d : grads.done) local += d.elems;
  if (!c.plan.offload.optimizer) {
    int tensors = 0;
    for (const Unit& u : c.units) tensors += u.tensors;
    if (c.plan.zero_stage > 0) tensors = (tensors + c.n - 1) / c.n;
    const double per_elem = 2.0 * (c.b.param + c.b.master + c.b.states) + c.b.grad;
    if (c.plan.steps_beside_last_reduce_scatter()) {
      // Stage 3: each landed unit stepped (one fused call each) while the last reduce-scatter is in
      // flight, then that one waited and its units stepped (the executor's step_beside_last_reduce_scatter).
      auto step_of = [&](const GradDone& d, TaskId after) {
        const auto share = static_cast<double>(d.elems) / static_cast<double>(std::max<std::int64_t>(1, local));
        const int t = std::max(1, static_cast<int>(std::ceil(tensors * share)));
        const double s = device_optimizer_time(c.cluster, name, static_cast<double>(d.elems), d.elems * per_elem, t, flat);
        const TaskId step = c.compute_task(s, c.n_optimizer, -1, -1);
        c.g.add_dep(step, d.task);
        c.g.add_dep(step, after);
        c.g.add_dep(step, gate);
        return step;
      };
      for (std::size_t i = 0; i + 1 < grads.done.size(); ++i) step_of(grads.done[i], kNone);
      const TaskId landed = grads.finish_step();
      const TaskId last = grads.done.empty() ? kNone : step_of(grads.done.back(), landed);
      if (grads.shard_alloc() != kNone) c.g.set_free_at(grads.shard_alloc(), last);
      return;
    }
    const double touched = static_cast<double>(local) * per_elem;
    const double s = device_optimizer_time(c.cluster, name, static_cast<double>(local), touched, tensors, flat);
    // A fused kernel (zeroplan's executor, torch.optim's fused=True, DeepSpeed's FusedAdam) updates in
    // place: no temporaries beyond the state.
    // An fp32 master steps unit by unit, each with an fp32 copy of that unit's 16-bit gradient (the
    // executor's step_master_by_unit): the largest unit's copy at a time, for the step.
    TaskId grads32 = kNone;
    if (c.b.master > 0) {
      grads32 = c.compute_task(device_copy_s(c, local, c.b.grad, 4), c.n_cast, -1, -1);
      c.g.add_dep(grads32, gate);
      for (const GradDone& d : grads.done) c.g.add_dep(grads32, d.task);
    }
    const TaskId step = c.compute_task(s, c.n_optimizer, -1, -1);
    if (grads32 != kNone) c.g.alloc(grads32, c.dev, largest_step_unit(c) * 4, MemCategory::buffers, c.label(c.n_grads), step);
    if (grads.shard_alloc() != kNone) c.g.set_free_at(grads.shard_alloc(), step);
    c.g.add_dep(step, gate);
    for (const GradDone& d : grads.done) c.g.add_dep(step, d.task);
    if (c.plan.zero_stage == 1 || c.plan.zero_stage == 2) {
      param_sync(c, {step});
    } else if (c.b.master > 0 && !(c.plan.zero_stage == 3 && c.plan.offload.params)) {
      // The updated master rounded into the 16-bit parameters (or their stage-3 shard).
      c.g.add_dep(c.compute_task(device_copy_s(c, local, 4, c.b.param), c.n_cast, -1, -1), step);
    }
    return;
  }
  // On the host the executor steps the shard once every final gradient is home (DeepSpeed's CPU Adam
  // also steps after the backward), then each unit's updated parameters go back to the device.
  const bool params_on_host = c.plan.zero_stage == 3 && c.plan.offload.params;
  std::vector<TaskId> after{gate};
  for (const GradDone& d : grads.done) after.push_back(d.task);
  const TaskId step = host_step(c, local, after, params_on_host);
  if (grads.shard_alloc() != kNone) c.g.set_free_at(grads.shard_alloc(), step);
  if (params_on_host) return;
  std::vector<TaskId> updated;
  for (const GradDone& d : grads.done) {
    const double bytes = static_cast<double>(d.elems * c.b.param);
    updated.push_back(c.g.add_task(c.h2d, copy_time(c.cluster, CopyDir::h2d, bytes), c.label(c.n_h2d), {step},
                                   c.n_cat_copy));
  }
  param_sync(c, updated);
}

TaskId host_step(Ctx& c, std::int64_t elems, const std::vector<TaskId>& after, bool params_on_host) {
  auto after_all = [&](TaskId t) {
    for (TaskId a : after) c.g.add_dep(t, a);
    return t;
  };
  // With a 16-bit model beside an fp32 master, the executor steps unit by unit from an fp32 copy of that
  // unit's gradient (step_master_by_unit): the largest unit's copy at a time, for the step. The copies run
  // on the rank's threads, as the optimizer does: the probe's flat Adam step over a shard beyond the
  // caches moves 14 bytes per parameter in memcpy terms (reads p, g, m, v; writes p, m, v), so its rate
  // bounds the bandwidth they reach from below, at least the single-thread memcpy (on the lent H100's
  // 16-core host the single-thread figure put gpt2-large's copy at 520 ms, 2.8x the whole measured
  // optimizer phase).
  const double bw = std::max(c.cluster.host.memcpy_bw_bytes_per_s, 14.0 * c.cluster.host.optimizer.adam.flat_params_per_s);
  TaskId grads32 = kNone;
  if (c.b.master > 0 && elems > 0) {
    const double s = static_cast<double>(elems) * (c.b.grad + 4.0) / 2.0 / bw;
    grads32 = after_all(c.g.add_task(c.host_opt, s, c.label(c.n_cast), {}, c.n_cat_optimizer));
  }
  const double s = host_optimizer_time(c.cluster, c.plan.optimizer.name, static_cast<double>(elems), true);
  const TaskId step = after_all(c.g.add_task(c.host_opt, s, c.label(c.n_optimizer), {}, c.n_cat_optimizer));
  if (grads32 == kNone) return step;
  c.g.add_dep(step, grads32);
  c.g.alloc(grads32, c.host, largest_step_unit(c) * 4, MemCategory::buffers, c.label(c.n_grads), step);
  // The updated master rounded into the 16-bit parameters beside it on the host.
  if (params_on_host)
    c.g.add_task(c.host_opt, static_cast<double>(elems) * (4.0 + c.b.param) / 2.0 / bw, c.label(c.n_cast), {step},
                 c.n_cat_optimizer);
  return step;
}

}  // namespace zeroplan::sim::lowering
