// The optimizer step: on the device over this rank's shard (memory-bound on a GPU; the host rates on a
// CPU device), or on the host (offloaded optimizer) per final gradient as it arrives, overlapping the
// backward, followed by the H2D of the updated parameters. Flat parameters make it one launch instead
// of one per tensor. Stages 1-2 then all-gather the updated parameters.
#include <algorithm>

#include "context.h"
#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim::lowering {

void param_sync(Ctx& c, const std::vector<TaskId>& after) {
  if (c.plan.zero_stage == 0 || c.plan.zero_stage == 3 || c.n <= 1) return;
  const int elem = c.plan.precision.broadcast_fp16 ? 2 : c.b.param;
  const std::int64_t total = c.total_params * elem;
  const std::int64_t bucket = std::max<std::int64_t>(1, c.plan.buckets.allgather_bucket_bytes);
  const std::int64_t buckets = (total + bucket - 1) / bucket;
  // Consecutive buckets are merged into at most 64 tasks (each costing the sum of its buckets).
  const std::int64_t tasks = std::min<std::int64_t>(buckets, 64);
  CollectiveOptions o;
  o.algo = c.opt.collective_algo;
  std::int64_t left = total;
  for (std::int64_t t = 0; t < tasks; ++t) {
    const std::int64_t k = buckets / tasks + (t < buckets % tasks ? 1 : 0);
    double s = 0;
    for (std::int64_t i = 0; i < k && left > 0; ++i) {
      const std::int64_t bytes = std::min(bucket, left);
      left -= bytes;
      s += collective_time(c.cluster, CollOp::all_gather, static_cast<double>(bytes), c.n, o);
    }
    const TaskId ag = c.g.add_task(c.comm, s, c.label(c.n_param_sync, -1, static_cast<int>(t)), {}, c.n_cat_comm);
    for (TaskId a : after) c.g.add_dep(ag, a);
    if (elem != c.b.param) c.g.alloc(ag, c.dev, std::min(bucket, total), MemCategory::buffers, c.label(c.n_bucket));
  }
}

void optimizer_step(Ctx& c, const GradSync& grads) {
  const TaskId gate = loss_scale_check(c, grads);
  const std::string& name = c.plan.optimizer.name;
  const bool flat = c.plan.flat_params;
  std::int64_t local = 0;
  for (const GradDone& d : grads.done) local += d.elems;
  if (!c.plan.offload.optimizer) {
    int tensors = 0;
    for (const Unit& u : c.units) tensors += u.tensors;
    if (c.plan.zero_stage > 0) tensors = (tensors + c.n - 1) / c.n;
    const double touched = static_cast<double>(local) * (2.0 * (c.b.param + c.b.master + c.b.states) + c.b.grad);
    const double s = device_optimizer_time(c.cluster, name, static_cast<double>(local), touched, tensors, flat);
    // A fused kernel (zeroplan's executor, torch.optim's fused=True, DeepSpeed's FusedAdam) updates in
    // place: no temporaries beyond the state.
    const TaskId step = c.compute_task(s, c.n_optimizer, -1, -1);
    // An fp32 master steps with an fp32 copy of the 16-bit gradients, for the step's duration.
    if (c.b.master > 0) c.g.alloc(step, c.dev, local * 4, MemCategory::buffers, c.label(c.n_grads));
    c.g.add_dep(step, gate);
    for (const GradDone& d : grads.done) c.g.add_dep(step, d.task);
    param_sync(c, {step});
    return;
  }
  std::vector<TaskId> updated;
  const bool params_on_host = c.plan.zero_stage == 3 && c.plan.offload.params;
  AllocId grads32 = kNone;
  TaskId last_step = kNone;
  for (const GradDone& d : grads.done) {
    const TaskId step = c.g.add_task(c.host_opt, host_optimizer_time(c.cluster, name, static_cast<double>(d.elems), flat),
                                     c.label(c.n_optimizer), {d.task, gate}, c.n_cat_optimizer);
    if (c.b.master > 0 && grads32 == kNone) {
      grads32 = c.g.alloc(step, c.host, local * 4, MemCategory::buffers, c.label(c.n_grads), kNone);
    }
    last_step = step;
    if (params_on_host) continue;
    const double bytes = static_cast<double>(d.elems * c.b.param);
    updated.push_back(c.g.add_task(c.h2d, copy_time(c.cluster, CopyDir::h2d, bytes), c.label(c.n_h2d), {step},
                                   c.n_cat_copy));
  }
  if (grads32 != kNone) c.g.set_free_at(grads32, last_step);
  param_sync(c, updated);
}

}  // namespace zeroplan::sim::lowering
