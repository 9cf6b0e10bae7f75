// LocalSGD and SlowMo (zero stage 0, fairscale's SlowMoDistributedDataParallel with the localsgd base
// algorithm; PyTorch's PostLocalSGDOptimizer for the warm-up):
//  - the first localsgd_warmup_steps steps are plain DDP (gradients all-reduced over every rank);
//  - after them gradients are all-reduced within the node only (no reduction with one rank per node),
//    and each rank steps its own replica;
//  - after step s (0-based) with (s + 1) % localsgd_frequency == 0 the parameters are averaged over every
//    rank (divided by the ranks, then one all-reduce of the flat buffer: fairscale's order);
//  - SlowMo (plan.slowmo()): after step s with (s + 1) % slowmo_frequency == 0, on the averaged x, with
//    the base learning rate lr: u = beta u + (x_old - x) / lr; x_old -= lr alpha u; x = x_old (fairscale's
//    rule; u and x_old fp32, full size on every rank).
// Without LocalSGD every step reduces over every rank and nothing happens after the step.
#include "pieces.h"
#include "strformat.h"
#include "zeroplan/exec/exec_errors.h"

namespace zeroplan::exec::pieces {

ReplicaSync::ReplicaSync(Ctx& c, ParamResidency& params, GradSync& grads) : c_(c), params_(params), grads_(grads) {
  grad_ranks_ = c.world;
  if (!c.plan.localsgd()) return;
  torch::NoGradGuard no_grad;
  c.at("all", "setup");
  if (c.ranks_per_node > 1 && c.ranks_per_node < c.world) node_ = c.comm.split(c.ranks_per_node);
  if (c.plan.slowmo()) {
    slow_momentum_ = c.dzeros(c.padded_total);
    old_params_ = c.dempty(c.padded_total);
    old_params_.copy_(params.flat());
  }
}

void ReplicaSync::begin_step(std::int64_t step) {
  if (!c_.plan.localsgd() || step < c_.plan.localsgd_warmup_steps) {
    grads_.set_all_reduce_comm(&c_.comm);
    grad_ranks_ = c_.world;
    return;
  }
  grad_ranks_ = c_.ranks_per_node;
  if (c_.ranks_per_node == 1) {
    grads_.set_all_reduce_comm(nullptr);
  } else {
    grads_.set_all_reduce_comm(node_ ? node_.get() : &c_.comm);
  }
}

void ReplicaSync::after_step(std::int64_t step) {
  const Plan& p = c_.plan;
  if (!p.localsgd() || step < p.localsgd_warmup_steps) return;
  const bool average = (step + 1) % p.localsgd_frequency == 0;
  const bool slow = p.slowmo() && (step + 1) % p.slowmo_frequency == 0;
  if (!average && !slow) return;
  torch::NoGradGuard no_grad;
  torch::Tensor& x = params_.flat();
  if (c_.world > 1 && c_.ranks_per_node < c_.world) {
    c_.at("all", "average_parameters");
    x.div_(static_cast<double>(c_.world));
    const double t = c_.rec.now_s();
    auto h = c_.tracker.issue(c_.comm.all_reduce(x, ReduceOp::kSum), t, "all_reduce parameters", "average_parameters",
                              -1, -1);
    c_.tracker.wait(h);
  }
  if (!slow) return;
  c_.at("all", "slowmo");
  const double t0 = c_.rec.now_s();
  const double lr = p.optimizer.lr;
  slow_momentum_.mul_(p.slowmo_momentum).sub_(x, 1.0 / lr).add_(old_params_, 1.0 / lr);
  old_params_.add_(slow_momentum_, -lr * p.slowmo_lr);
  x.copy_(old_params_);
  c_.dev.wait_compute();
  c_.rec.span(Lane::compute, "slowmo update", t0, c_.rec.now_s(), "optimizer");
}

}  // namespace zeroplan::exec::pieces
