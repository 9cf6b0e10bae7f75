// The executor's pieces (pieces.h lists them): What every step driver does alike: a unit's backward, the loss, the model's input (autograd_step.cpp).
#pragma once

#include "context.h"
#include "adascale.h"

namespace zeroplan::exec::pieces {

// Differentiates unit u's output `out` (with its graph) from its input leaf `in` with the incoming
// gradient: the gradients of its parameters (and of the weights it borrows) accumulate into
// region(owner); returns the gradient of its input (undefined for the model's input). `in_place`
// (Plan::grads_in_place; never with AdaScale): autograd adds each parameter's gradient into its region as
// it makes it (the region a view as the parameter's .grad for the backward; the profile's
// bytes_peak_bwd_in_place); else autograd returns them and they are added after (bytes_peak_bwd), AdaScale
// (when given) seeing each.
torch::Tensor differentiate(Ctx& c, int u, torch::Tensor out, const torch::Tensor& in, const torch::Tensor& grad,
                            const std::function<torch::Tensor(int)>& region, AdaScale* adascale, bool in_place);
// The loss of one microbatch from the last unit's output, its gradient scaled by `scale`: the loss in
// fp32 (autocast's rule for losses) from the logits in their compute dtype; the gradient comes back in
// that dtype, the fp32 copy and its gradient freed with the loss (as the profiler measures the last unit).
torch::Tensor loss_grad(Ctx& c, torch::Tensor last, const torch::Tensor& target, int micro, double scale,
                        double& loss_sum);
// The model's input on the device; floating inputs (images) in the compute dtype, as the profiler feeds
// them (16-bit weights compute on 16-bit inputs; token ids stay integers).
torch::Tensor model_input(const Ctx& c, torch::Tensor t);

}  // namespace zeroplan::exec::pieces
