// Precision bookkeeping before the optimizer step: unscale and check the local gradients for inf/NaN
// (a memory-bound pass), and with dynamic loss scaling agree across ranks (a 4-byte all-reduce);
// AdaScale adds a small all-reduce of squared norms. Byte sizes per dtype are in bytes_of (context.cpp).
#include "context.h"
#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim::lowering {

TaskId loss_scale_check(Ctx& c, const GradSync& grads) {
  const bool scaled = c.plan.precision.loss_scale.mode != LossScale::Mode::none;
  if (!scaled && !c.plan.adascale) return kNone;
  std::int64_t local = 0;
  for (const GradDone& d : grads.done) local += d.elems;
  const double pass = static_cast<double>(local * c.b.grad) / c.cluster.device.mem_bw_bytes_per_s +
                      c.cluster.device.launch_overhead_s;
  TaskId check = c.compute_task(pass, c.n_loss_scale, -1, -1);
  for (const GradDone& d : grads.done) c.g.add_dep(check, d.task);
  const bool agree = c.plan.precision.loss_scale.mode == LossScale::Mode::dynamic;
  const double bytes = (agree ? 4.0 : 0.0) + (c.plan.adascale ? 8.0 : 0.0);
  if (bytes > 0 && c.n > 1) {
    check = c.g.add_task(c.comm, collective_time(c.cluster, CollOp::all_reduce, bytes, c.n), c.label(c.n_all_reduce),
                         {check}, c.n_cat_comm);
  }
  return check;
}

}  // namespace zeroplan::sim::lowering
