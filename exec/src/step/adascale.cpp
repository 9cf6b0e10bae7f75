// AdaScale in the step: the squared norms of each microbatch's local gradient (tied weights: of the sum
// of the owner's and the borrowers' parts), one all-reduce of two numbers with the final gradient's
// squared norm, and the gain from AdaScaleGain (optimizer.h), fairscale's estimator. The executor's
// gradients carry the loss scale 1 / (ranks x microbatches), undone here.
#include "pieces.h"

namespace zeroplan::exec::pieces {

AdaScale::AdaScale(Ctx& c) : c_(c), gain_(static_cast<double>(c.world) * c.plan.microbatches) {}

void AdaScale::begin_step() {
  local_sqr_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(c_.dev.torch_device()));
  tied_.clear();
}

void AdaScale::borrowed(int owner, std::int64_t offset, const torch::Tensor& g) {
  torch::Tensor& t = tied_[{owner, offset}];
  t = t.defined() ? t + g : g;
}

void AdaScale::own(int u, std::int64_t offset, const torch::Tensor& g) {
  torch::NoGradGuard no_grad;
  torch::Tensor flat = g.reshape({-1});
  auto it = tied_.find({u, offset});
  if (it != tied_.end()) {
    flat = flat + it->second.reshape({-1});
    tied_.erase(it);
  }
  local_sqr_.add_(torch::dot(flat, flat).to(torch::kFloat64));
}

double AdaScale::finish(GradSync& grads) {
  torch::NoGradGuard no_grad;
  if (gain_.samples() <= 1) return 1.0;
  c_.at("all", "adascale");
  // Undo the loss scale: g_i = (ranks x microbatches) x the executor's per-microbatch gradient.
  const double s = gain_.samples();
  torch::Tensor both = torch::stack({local_sqr_ * (s * s), grads.sqr_norm_share()});
  const double t = c_.rec.now_s();
  auto h = c_.tracker.issue(c_.comm.all_reduce(both, ReduceOp::kSum), t, "all_reduce adascale", "all_reduce", -1, -1);
  c_.tracker.wait(h);
  both = both.cpu();
  return gain_.update(both[0].item<double>(), both[1].item<double>());
}

}  // namespace zeroplan::exec::pieces
