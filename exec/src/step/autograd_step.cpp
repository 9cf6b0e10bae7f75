// What every step driver does the same way around autograd (the plain step and pipeline stages in
// executor.cpp, OffloadModel's schedule in offload_model.cpp): a unit's backward into the gradient
// regions, the loss and its gradient, the model's input on the device, the RNG state and buffers around a
// recompute.
#include <utility>

#include "pieces.h"

namespace zeroplan::exec::pieces {

torch::Tensor differentiate(Ctx& c, int u, torch::Tensor out, const torch::Tensor& in, const torch::Tensor& grad,
                            const std::function<torch::Tensor(int)>& region, AdaScale* adascale, bool in_place) {
  UnitRT& U = c.unit(u);
  std::vector<torch::Tensor> inputs;
  const bool input_grad = in.defined() && in.requires_grad();
  if (input_grad) inputs.push_back(in);
  for (const auto& s : U.flat.slots()) inputs.push_back(s.param);
  for (const auto& b : U.borrows) inputs.push_back(b.param);
  const bool run = !inputs.empty() && grad.defined() && out.requires_grad();
  // The incoming gradient in the output's dtype (16-bit compute, an fp32 loss).
  const torch::Tensor g = !run || grad.scalar_type() == out.scalar_type() ? grad : grad.to(out.scalar_type());

  TORCH_INTERNAL_ASSERT(!in_place || adascale == nullptr, "AdaScale reads the gradients autograd returns");
  if (in_place) {
    // Each parameter's gradient is a view of its region and autograd adds what it makes into it and frees
    // it, one parameter at a time (DDP's in-place accumulation into its buckets): the unit's gradients
    // never exist twice.
    {
      torch::NoGradGuard no_grad;
      if (U.numel() > 0) {
        torch::Tensor own = region(u);
        for (const auto& s : U.flat.slots()) s.param.mutable_grad() = own.narrow(0, s.offset, s.numel).view(s.shape);
      }
      for (const auto& b : U.borrows)
        b.param.mutable_grad() = region(b.owner).narrow(0, b.offset, b.numel).view(b.param.sizes());
      if (input_grad) in.mutable_grad() = torch::Tensor();
    }
    if (run) torch::autograd::backward({out}, {g}, /*retain_graph=*/false, /*create_graph=*/false, inputs);
    out = torch::Tensor();
    for (const auto& s : U.flat.slots()) s.param.mutable_grad() = torch::Tensor();
    for (const auto& b : U.borrows) b.param.mutable_grad() = torch::Tensor();
    if (!input_grad) return torch::Tensor();
    torch::Tensor grad_in = std::exchange(in.mutable_grad(), torch::Tensor());
    return grad_in.defined() ? grad_in : torch::zeros_like(in);
  }

  // Returned by autograd and added into the regions (AdaScale sees each microbatch's gradient).
  std::vector<torch::Tensor> grads;
  if (run) {
    grads = torch::autograd::grad({out}, inputs, {g}, /*retain_graph=*/false, /*create_graph=*/false,
                                  /*allow_unused=*/true);
  } else {
    grads.assign(inputs.size(), torch::Tensor());
  }
  {
    torch::NoGradGuard no_grad;
    std::size_t i = input_grad ? 1 : 0;
    torch::Tensor own = U.numel() > 0 ? region(u) : torch::Tensor();
    for (const auto& s : U.flat.slots()) {
      const torch::Tensor& gs = grads[i++];
      if (!gs.defined()) continue;
      own.narrow(0, s.offset, s.numel).add_(gs.reshape({-1}));
      if (adascale != nullptr) adascale->own(u, s.offset, gs);
    }
    for (const auto& b : U.borrows) {
      const torch::Tensor& gb = grads[i++];
      if (!gb.defined()) continue;
      region(b.owner).narrow(0, b.offset, b.numel).add_(gb.reshape({-1}));
      if (adascale != nullptr) adascale->borrowed(b.owner, b.offset, gb);
    }
  }
  torch::Tensor grad_in;
  if (input_grad) grad_in = grads[0].defined() ? grads[0] : torch::zeros_like(in);
  return grad_in;
}

torch::Tensor loss_grad(Ctx& c, torch::Tensor last, const torch::Tensor& target, int micro, double scale,
                        double& loss_sum) {
  c.at(c.units.back().name, "loss");
  const double t0 = c.rec.now_s();
  torch::Tensor z = last.detach().requires_grad_(true);
  last = torch::Tensor();  // the last unit's graph keeps its output while it needs it, not the loop
  torch::Tensor loss = c.model.task->loss(z.to(torch::kFloat32), target);
  loss_sum += loss.item<double>();
  torch::Tensor gz = torch::autograd::grad({loss}, {z}, {torch::full({}, scale, loss.options())})[0];
  // The loss and its gradient are the last unit's forward, as the profiler measures that unit.
  c.rec.span(Lane::compute, "loss", t0, c.rec.now_s(), "forward", c.unit_count() - 1, micro);
  return gz;
}

torch::Tensor model_input(const Ctx& c, torch::Tensor t) {
  if (t.is_floating_point() && t.scalar_type() != c.dt.compute) return t.to(c.dev.torch_device(), c.dt.compute);
  return t.to(c.dev.torch_device());
}

Recompute::Replay::Replay(Recompute& r, Device& dev, const std::vector<std::shared_ptr<zoo::UnitModule>>& modules)
    : dev_(dev), caller_rng_(dev.rng_state()) {
  dev.set_rng_state(r.rng_);
  for (const auto& m : modules) {
    r.modules_.push_back(m);
    for (const auto& b : m->buffers()) r.kept_.push_back(b.clone());
  }
}

void Recompute::restore_buffers() {
  if (!kept_.empty()) {
    torch::NoGradGuard no_grad;
    std::size_t i = 0;
    for (const auto& m : modules_)
      for (auto& b : m->buffers()) b.copy_(kept_[i++]);
  }
  kept_.clear();
  modules_.clear();
  rng_ = torch::Tensor();
}

}  // namespace zeroplan::exec::pieces
