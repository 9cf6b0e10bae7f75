#include "zeroplan/exec/optimizer.h"

#include <algorithm>
#include <string>

#include "zeroplan/exec/exec_errors.h"

namespace zeroplan::exec {

namespace {

enum class Kind { adam, adamw, sgd };

Kind kind_of(const std::string& name) {
  if (name == "adam") return Kind::adam;
  if (name == "adamw") return Kind::adamw;
  if (name == "sgd") return Kind::sgd;
  throw ExecError("optimizer '" + name + "' is not run by the executor (adam, adamw, sgd)");
}

}  // namespace

FlatOptimizer::FlatOptimizer(const Optimizer& config, const std::vector<std::int64_t>& segment_numels,
                             const std::function<torch::Tensor(std::int64_t)>& alloc)
    : config_(config) {
  const Kind kind = kind_of(config.name);
  for (std::int64_t n : segment_numels) {
    if (kind == Kind::sgd) {
      exp_avg_.push_back(config.momentum != 0 ? alloc(n) : torch::Tensor());
    } else {
      exp_avg_.push_back(alloc(n));
      exp_avg_sq_.push_back(alloc(n));
      state_step_.push_back(alloc(1));
    }
  }
}

std::int64_t FlatOptimizer::state_numel() const {
  std::int64_t n = 0;
  for (const auto& t : exp_avg_) n += t.defined() ? t.numel() : 0;
  for (const auto& t : exp_avg_sq_) n += t.numel();
  return n;
}

void FlatOptimizer::step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                         double lr_scale) {
  TORCH_INTERNAL_ASSERT(params.size() == exp_avg_.size() && grads.size() == params.size());
  torch::NoGradGuard no_grad;
  ++step_;
  const Kind kind = kind_of(config_.name);
  // The kernels take lists; empty segments (a rank whose shard of a unit is empty) stay out of them.
  std::vector<torch::Tensor> p, g, m, v, t;
  for (std::size_t i = 0; i < params.size(); ++i) {
    TORCH_INTERNAL_ASSERT(params[i].is_contiguous() && grads[i].is_contiguous() &&
                          params[i].numel() == grads[i].numel());
    if (params[i].numel() == 0) continue;
    p.push_back(params[i]);
    g.push_back(grads[i]);
    if (exp_avg_[i].defined()) m.push_back(exp_avg_[i]);
    if (kind != Kind::sgd) {
      v.push_back(exp_avg_sq_[i]);
      t.push_back(state_step_[i]);
    }
  }
  if (p.empty()) return;
  const double lr = config_.lr * lr_scale;
  if (kind == Kind::sgd) {
    // torch::optim::SGD: buf = grad (+ wd p) on the first step, buf = momentum buf + grad after.
    at::_fused_sgd_(p, g, m, config_.weight_decay, config_.momentum, lr, /*dampening=*/0.0,
                    /*nesterov=*/false, /*maximize=*/false, /*is_first_step=*/step_ == 1);
    return;
  }
  for (auto& s : t) s.fill_(static_cast<double>(step_));
  const double b1 = config_.betas[0], b2 = config_.betas[1];
  if (kind == Kind::adamw) {
    at::_fused_adamw_(p, g, m, v, {}, t, lr, b1, b2, config_.weight_decay, config_.eps,
                      /*amsgrad=*/false, /*maximize=*/false);
  } else {
    at::_fused_adam_(p, g, m, v, {}, t, lr, b1, b2, config_.weight_decay, config_.eps,
                     /*amsgrad=*/false, /*maximize=*/false);
  }
}

void FlatOptimizer::begin_step() {
  ++step_;
  for (auto& s : state_step_)
    if (s.defined()) s.fill_(static_cast<double>(step_));
}

void FlatOptimizer::step_range(std::size_t segment, std::int64_t offset, const torch::Tensor& param_part,
                               const torch::Tensor& grad_part, double lr_scale) {
  TORCH_INTERNAL_ASSERT(segment < exp_avg_.size() && param_part.numel() == grad_part.numel() &&
                        param_part.is_contiguous() && grad_part.is_contiguous());
  if (param_part.numel() == 0) return;
  torch::NoGradGuard no_grad;
  const std::int64_t n = param_part.numel();
  const Kind kind = kind_of(config_.name);
  std::vector<torch::Tensor> p{param_part}, g{grad_part}, m, v, t;
  if (exp_avg_[segment].defined()) m.push_back(exp_avg_[segment].narrow(0, offset, n));
  const double lr = config_.lr * lr_scale;
  if (kind == Kind::sgd) {
    at::_fused_sgd_(p, g, m, config_.weight_decay, config_.momentum, lr, /*dampening=*/0.0,
                    /*nesterov=*/false, /*maximize=*/false, /*is_first_step=*/step_ == 1);
    return;
  }
  v.push_back(exp_avg_sq_[segment].narrow(0, offset, n));
  t.push_back(state_step_[segment]);
  const double b1 = config_.betas[0], b2 = config_.betas[1];
  if (kind == Kind::adamw) {
    at::_fused_adamw_(p, g, m, v, {}, t, lr, b1, b2, config_.weight_decay, config_.eps, false, false);
  } else {
    at::_fused_adam_(p, g, m, v, {}, t, lr, b1, b2, config_.weight_decay, config_.eps, false, false);
  }
}

std::vector<std::string> FlatOptimizer::state_kinds() const {
  if (kind_of(config_.name) != Kind::sgd) return {"exp_avg", "exp_avg_sq"};
  return config_.momentum != 0 ? std::vector<std::string>{"momentum"} : std::vector<std::string>{};
}

torch::Tensor FlatOptimizer::state(std::size_t kind) const {
  const std::vector<torch::Tensor>& segs = kind == 0 ? exp_avg_ : exp_avg_sq_;
  return torch::cat(segs);
}

void FlatOptimizer::set_state(std::size_t kind, const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor>& segs = kind == 0 ? exp_avg_ : exp_avg_sq_;
  std::int64_t at = 0;
  for (auto& s : segs) {
    s.copy_(flat.narrow(0, at, s.numel()));
    at += s.numel();
  }
  TORCH_INTERNAL_ASSERT(at == flat.numel(), "optimizer state of ", flat.numel(), " elements for ", at);
}

void FlatOptimizer::set_steps(std::int64_t steps) {
  step_ = steps;
  for (auto& s : state_step_) s.fill_(static_cast<double>(steps));
}

AdaScaleGain::AdaScaleGain(double samples) : samples_(samples), smoothing_(std::max(1.0 - samples / 1000.0, 0.0)) {}

double AdaScaleGain::update(double sum_sample_sqr, double mean_sqr) {
  const double S = samples_;
  if (S <= 1) return 1.0;
  double var = sum_sample_sqr / (S - 1) - mean_sqr * S / (S - 1);
  double sqr = mean_sqr - var / S;
  var = std::max(var, 1e-6);
  sqr = std::max(sqr, 0.0);
  const double f = smoothing_;
  sqr_biased_ = f * sqr_biased_ + (1 - f) * sqr;
  var_biased_ = f * var_biased_ + (1 - f) * var;
  unbias_ = f * unbias_ + (1 - f);
  const double sqr_avg = sqr_biased_ / unbias_, var_avg = var_biased_ / unbias_;
  return (var_avg + sqr_avg) / (var_avg / S + sqr_avg);
}

}  // namespace zeroplan::exec
