// fairscale OffloadModel's parameter and gradient residency (the schedule is the step driver's,
// executor.cpp, as the simulator's is sim/src/lowering/offload_model.cpp). Slices come from
// offload_model_slice_starts, the simulator's function; a slice's units and the owners of the weights
// they borrow are on the device while it runs. Parameters come from the host's flat buffer and are only
// read on the device, so dropping them copies nothing back; gradients go home after the slice's backward.
#include <algorithm>

#include "pieces.h"
#include "zeroplan/profiles/pipeline.h"

namespace zeroplan::exec::pieces {

OffloadModel::OffloadModel(Ctx& c, ParamResidency& params, GradSync& grads) : c_(c), params_(params), grads_(grads) {
  std::vector<std::int64_t> numel;
  for (const UnitRT& U : c.units) numel.push_back(U.numel());
  starts_ = offload_model_slice_starts(numel, c.plan.offload_model.slices);
  loaded_.assign(c.units.size(), 0);
  grad_.resize(c.units.size());
}

std::vector<int> OffloadModel::members(int s) const {
  std::vector<int> out;
  for (int u = first(s); u < end(s); ++u) out.push_back(u);
  for (int u = first(s); u < end(s); ++u) {
    for (const Borrow& b : c_.unit(u).borrows) {
      if (b.owner < first(s) && std::find(out.begin(), out.end(), b.owner) == out.end()) out.push_back(b.owner);
    }
  }
  return out;
}

void OffloadModel::load_params(int u, int micro) {
  UnitRT& U = c_.unit(u);
  const auto i = static_cast<std::size_t>(u);
  if (loaded_[i] || U.numel() == 0) return;
  c_.at(U.name, "h2d params");
  realloc_storage(U.full);
  const double t0 = c_.rec.now_s();
  c_.dev.copy_h2d(U.full, params_.flat().narrow(0, U.base, U.layout.padded_numel()));
  c_.dev.wait_copies();
  c_.rec.span(Lane::h2d, "h2d params " + U.name, t0, c_.rec.now_s(), "h2d", u, micro);
  loaded_[i] = 1;
}

void OffloadModel::drop_params(int u) {
  UnitRT& U = c_.unit(u);
  const auto i = static_cast<std::size_t>(u);
  if (!loaded_[i]) return;
  free_storage(U.full);
  loaded_[i] = 0;
}

void OffloadModel::load_forward(int s, int micro) {
  torch::NoGradGuard no_grad;
  for (int u : members(s)) load_params(u, micro);
}

void OffloadModel::drop_forward(int s) {
  for (int u : members(s)) drop_params(u);
}

void OffloadModel::load_backward(int s, int micro) {
  torch::NoGradGuard no_grad;
  micro_ = micro;
  for (int u : members(s)) {
    load_params(u, micro);
    if (c_.unit(u).numel() > 0) region(u);
  }
}

torch::Tensor OffloadModel::region(int u) {
  torch::Tensor& g = grad_[static_cast<std::size_t>(u)];
  if (g.defined()) return g;
  const UnitRT& U = c_.unit(u);
  if (micro_ == 0) {
    g = c_.dzeros(U.layout.padded_numel(), c_.dt.grad);
    return g;
  }
  // Later microbatches: the gradient accumulated so far comes back with the slice.
  torch::NoGradGuard no_grad;
  g = c_.dempty(U.layout.padded_numel(), c_.dt.grad);
  const double t0 = c_.rec.now_s();
  c_.dev.copy_h2d(g, grads_.full().narrow(0, U.base, U.layout.padded_numel()));
  c_.dev.wait_copies();
  c_.rec.span(Lane::h2d, "h2d grads " + U.name, t0, c_.rec.now_s(), "h2d", u, micro_);
  return g;
}

void OffloadModel::finish_backward(int s, int micro, bool last_micro) {
  torch::NoGradGuard no_grad;
  for (int u = first(s); u < end(s); ++u) {
    torch::Tensor& g = grad_[static_cast<std::size_t>(u)];
    UnitRT& U = c_.unit(u);
    if (U.numel() == 0) continue;
    if (!g.defined()) region(u);  // a unit whose backward wrote nothing still sends its gradient home
    if (last_micro && c_.world > 1) {
      c_.at(U.name, "all_reduce");
      const double t = c_.rec.now_s();
      torch::Tensor wire = c_.dt.all_reduce == c_.dt.grad ? g : g.to(c_.dt.all_reduce);
      auto h = c_.tracker.issue(c_.comm.all_reduce(wire, ReduceOp::kSum), t, "all_reduce " + U.name, "all_reduce", u, micro);
      c_.tracker.wait(h);
      if (!wire.is_same(g)) g.copy_(wire);
    }
    c_.at(U.name, "d2h grads");
    const double t0 = c_.rec.now_s();
    c_.dev.copy_d2h(grads_.full().narrow(0, U.base, U.layout.padded_numel()), g);
    c_.dev.wait_copies();
    c_.rec.span(Lane::d2h, "d2h grads " + U.name, t0, c_.rec.now_s(), "d2h", u, micro);
    g = torch::Tensor();
  }
  for (int u : members(s)) drop_params(u);
}

}  // namespace zeroplan::exec::pieces
