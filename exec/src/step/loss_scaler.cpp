#include "zeroplan/exec/loss_scaler.h"

#include <map>

namespace zeroplan::exec {

LossScaler::LossScaler(const LossScale& config, torch::Device device, LossScalerOptions options)
    : mode_(config.mode), options_(options) {
  TORCH_INTERNAL_ASSERT(options_.growth_interval >= 1 && options_.init_scale > 0);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  const double init = mode_ == LossScale::Mode::fixed ? config.value : (dynamic() ? options_.init_scale : 1.0);
  scale_ = torch::full({1}, init, f32);
  growth_tracker_ = torch::zeros({1}, f32.dtype(torch::kInt32));
  found_inf_ = torch::zeros({1}, f32);
}

void LossScaler::set_growth_interval(int steps) {
  TORCH_INTERNAL_ASSERT(steps >= 1);
  options_.growth_interval = steps;
}

double LossScaler::scale() const { return scale_.item<double>(); }
int LossScaler::clean_steps() const { return growth_tracker_.item<int>(); }

void LossScaler::load_state(double scale, int clean_steps) {
  if (!enabled()) return;
  torch::NoGradGuard no_grad;
  scale_.fill_(scale);
  growth_tracker_.fill_(clean_steps);
}

bool LossScaler::unscale_and_check(const std::vector<torch::Tensor>& grads, Communicator* comm, bool unscale) {
  if (!enabled()) return false;
  torch::NoGradGuard no_grad;
  found_inf_.zero_();
  // The kernel takes tensors of one device and dtype per call, with the inverse scale beside them.
  std::map<std::pair<int, int>, std::vector<torch::Tensor>> groups;
  for (const auto& g : grads) {
    if (g.defined() && g.numel() > 0) {
      groups[{static_cast<int>(g.device().type()), static_cast<int>(g.scalar_type())}].push_back(g);
    }
  }
  const torch::Tensor inv = unscale ? scale_.reciprocal() : torch::ones_like(scale_);
  for (auto& [key, list] : groups) {
    const torch::Device d = list.front().device();
    torch::Tensor found = found_inf_.to(d), inv_d = inv.to(d);
    at::_amp_foreach_non_finite_check_and_unscale_(list, found, inv_d);
    if (!found.is_same(found_inf_)) found_inf_.add_(found.to(found_inf_.device()));  // a copy: bring the flag back
  }
  if (!dynamic()) return false;
  if (comm != nullptr && comm->world_size() > 1) comm->all_reduce(found_inf_, ReduceOp::kSum)->wait();
  return found_inf_.item<double>() > 0;
}

void LossScaler::update(bool skipped) {
  if (!dynamic()) return;
  found_inf_.fill_(skipped ? 1.0 : 0.0);
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor, options_.backoff_factor,
                         options_.growth_interval);
}

}  // namespace zeroplan::exec
