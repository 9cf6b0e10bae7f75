// The executor's pieces (pieces.h lists them): OffloadModel (offload_model.cpp).
#pragma once

#include "context.h"
#include "param_residency.h"
#include "grad_sync.h"
#include "optimizer_step.h"
#include "adascale.h"

namespace zeroplan::exec::pieces {

// fairscale OffloadModel (zero stage 0): parameters, gradients and optimizer state live on the host
// (ParamResidency::flat(), GradSync::full(), OptimizerStep). Slices of consecutive units, balanced by
// parameter count (offload_model_slice_starts, as the simulator), are loaded to the device for their
// forward and again for their backward; a unit that lends weights to a later one (tied weights) is loaded
// with its borrower's slice too, as fairscale moves a shared parameter with whichever shard holds it.
// Gradients: a unit's device gradient exists from its first backward use in the microbatch (its own
// slice, or a borrower's) until its own slice's backward ends; it starts from zeros in the first
// accumulation microbatch and from the host's copy after that (fairscale moves .grad with the shard),
// is all-reduced on the last one (no_sync before it) and copied home.
class OffloadModel {
 public:
  // adascale: when the plan runs AdaScale (it sees every parameter gradient), else nullptr.
  OffloadModel(Ctx& c, ParamResidency& params, GradSync& grads, AdaScale* adascale);
  // One accumulation microbatch `j` of step `step` (sim/src/lowering/offload_model.cpp): forward and
  // backward over the slices, the loss (the chunks' losses added to loss_sum, the gradient scaled by
  // `scale`), the gradients home.
  void microbatch(std::int64_t step, int j, double scale, double& loss_sum);

 private:
  int slices() const { return static_cast<int>(starts_.size()) - 1; }
  int first(int s) const { return starts_[static_cast<std::size_t>(s)]; }
  int end(int s) const { return starts_[static_cast<std::size_t>(s) + 1]; }
  // Slice s's parameters (and those its units borrow) on the device; for the backward (micro: the outer
  // accumulation microbatch) their gradients too.
  void load_forward(int s, int micro);
  void load_backward(int s, int micro);
  void drop_forward(int s);
  // After slice s's backward: the gradients of its units all-reduced (last microbatch, several ranks),
  // copied to the host and freed with the slice's parameters.
  void finish_backward(int s, int micro, bool last_micro);
  // Where unit u's gradient accumulates (on the device while its slice or a borrower's is loaded).
  torch::Tensor region(int u);
  torch::Tensor unit_forward(int u, const torch::Tensor& x, int micro, bool recompute, torch::Tensor* in_leaf);
  // The slice's units and the owners its units borrow from (offload_model_slice_members).
  const std::vector<int>& members(int s) const { return members_[static_cast<std::size_t>(s)]; }
  void load_params(int u, int micro);
  void drop_params(int u);
  Ctx& c_;
  ParamResidency& params_;
  GradSync& grads_;
  AdaScale* adascale_ = nullptr;
  std::vector<int> starts_;
  std::vector<std::vector<int>> members_;
  std::vector<char> loaded_;
  std::vector<torch::Tensor> grad_;  // per unit: its device gradient while it exists
  int micro_ = 0;                    // the outer microbatch of the backward under way
};

}  // namespace zeroplan::exec::pieces
