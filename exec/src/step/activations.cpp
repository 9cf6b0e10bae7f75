// Activations of one microbatch, per unit. Each unit's input is a detached leaf (its own autograd graph).
// Kept: the unit's output with its graph lives until the unit's backward. Checkpointed: the forward runs
// without a graph keeping only the input and the RNG state; the backward recomputes it under the same RNG
// state, and BatchNorm-style buffers the recompute updated a second time are put back after the backward.
// checkpoint_offload (fairscale checkpoint_wrapper(offload_to_cpu=True)): the kept input is copied to the
// host pool after the forward, freeing the device copy, and back when the backward reaches the unit.
// Both run in the compute dtype (ComputeScope, precision.cpp). Kept units may send a ratio of their
// saved tensors to the host (ActivationOffload, activation_offload.cpp).
#include "pieces.h"

namespace zeroplan::exec::pieces {

Activations::Activations(Ctx& c) : c_(c), state_(c.units.size()), offload_(c) {}

torch::Tensor Activations::forward(int u, const torch::Tensor& x, int micro) {
  (void)micro;
  State& s = state_[static_cast<std::size_t>(u)];
  UnitRT& U = c_.unit(u);
  torch::Tensor in = ((u > 0 || c_.input_grad) && x.is_floating_point()) ? x.detach().requires_grad_(true) : x;
  torch::Tensor out;
  ComputeScope compute(c_.dt, c_.dev.torch_device().type());
  if (U.checkpoint) {
    s.recompute.save_rng(c_.dev);
    auto none = offload_.capture(u, true);
    torch::NoGradGuard no_grad;
    out = U.module->forward(in);
  } else {
    auto saved = offload_.capture(u, false, in);  // activation offload sees what autograd saves
    out = U.module->forward(in);
  }
  offload_.end_forward(u, in, out);
  s.in = in;
  s.out = U.checkpoint ? torch::Tensor() : out;
  if (U.checkpoint && c_.plan.checkpoint_offload && in.numel() > 0) {
    s.in_shape = in.sizes().vec();
    s.in_grad = in.requires_grad();
    s.in_host = c_.dev.host_pool().empty(in.numel(), in.scalar_type());
    c_.dev.copy_d2h(s.in_host, in.detach().reshape({-1}));
    c_.dev.wait_copies();  // the device copy goes once the host holds it
    s.in = torch::Tensor();
  }
  return out;
}

torch::Tensor Activations::output_for_backward(int u, int micro) {
  State& s = state_[static_cast<std::size_t>(u)];
  UnitRT& U = c_.unit(u);
  offload_.before_bwd(u);
  if (!U.checkpoint) return s.out;
  c_.cur_phase = "recompute";
  const double t0 = c_.rec.now_s();
  if (s.in_host.defined()) {  // checkpoint_offload: the input comes back for the recompute
    torch::Tensor back = torch::empty(s.in_shape, s.in_host.options().device(c_.dev.torch_device()));
    c_.dev.copy_h2d(back.view({-1}), s.in_host);
    c_.dev.wait_copies();
    s.in_host = torch::Tensor();
    s.in = s.in_grad ? back.requires_grad_(true) : back;
  }
  torch::Tensor out;
  {
    // The recompute must not update BatchNorm's running statistics a second time: after_bwd puts them back.
    Recompute::Replay replay(s.recompute, c_.dev, {U.module});
    ComputeScope compute(c_.dt, c_.dev.torch_device().type());
    out = U.module->forward(s.in);
  }
  c_.dev.wait_compute();
  c_.rec.span(Lane::compute, "recompute " + U.name, t0, c_.rec.now_s(), "recompute", u, micro);
  c_.cur_phase = "backward";
  return out;
}

void Activations::after_bwd(int u) {
  offload_.after_bwd(u);
  State& s = state_[static_cast<std::size_t>(u)];
  s.recompute.restore_buffers();
  s.in = s.out = s.in_host = torch::Tensor();
}

}  // namespace zeroplan::exec::pieces
