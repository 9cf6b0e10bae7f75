// The schedule of one step: for each microbatch, forward over the units then backward in reverse, each
// unit asking the pieces what it waits for; then the optimizer step.
#include "context.h"

namespace zeroplan::sim::lowering {

void schedule_step(Ctx& c) {
  ParamResidency params(c);
  Activations acts(c);
  GradSync grads(c);
  zero_grads(c);  // first on the compute stream: every forward runs after it
  const int units = static_cast<int>(c.units.size());
  for (int mb = 0; mb < c.m; ++mb) {
    for (int u = 0; u < units; ++u) {
      const TaskId ready = params.before_fwd(u, mb);
      const TaskId fwd = c.compute_task(c.units[static_cast<std::size_t>(u)].fwd_s, c.n_fwd, u, mb);
      c.g.add_dep(fwd, ready);
      if (u == 0 && mb > 0) c.g.add_dep(fwd, grads.microbatch_barrier());
      c.fwd[static_cast<std::size_t>(u)] = fwd;
      if (mb == 0) c.fwd0[static_cast<std::size_t>(u)] = fwd;
      acts.on_fwd(u, mb, fwd);
      params.after_fwd(u, mb, fwd);
    }
    for (int u = units - 1; u >= 0; --u) {
      const TaskId params_ready = params.before_bwd(u, mb);
      const TaskId acts_ready = acts.before_bwd(u, mb, params_ready);
      const TaskId bwd = c.compute_task(c.units[static_cast<std::size_t>(u)].bwd_s, c.n_bwd, u, mb);
      c.g.add_dep(bwd, params_ready);
      c.g.add_dep(bwd, acts_ready);
      c.bwd[static_cast<std::size_t>(u)] = bwd;
      if (mb == 0) c.bwd0[static_cast<std::size_t>(u)] = bwd;
      // Gathered parameters are released once the gradient is accumulated (before it is reduce-scattered,
      // as FSDP reshards before its reduce-scatter).
      const TaskId done = grads.after_bwd(u, mb, bwd);
      acts.after_bwd(u, mb, bwd);
      params.after_bwd(u, mb, done);
      c.bwd[static_cast<std::size_t>(u)] = done;  // what waits for this unit's backward waits for all of it
    }
    grads.finish_microbatch(mb);
  }
  optimizer_step(c, grads);
}

}  // namespace zeroplan::sim::lowering
