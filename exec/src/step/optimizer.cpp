#include "zeroplan/exec/optimizer.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

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
                             const std::function<torch::Tensor(std::int64_t)>& alloc, bool host)
    : config_(config), host_(host) {
  const Kind kind = kind_of(config.name);
  for (std::int64_t n : segment_numels) {
    if (kind == Kind::sgd) {
      exp_avg_.push_back(config.momentum != 0 ? alloc(n) : torch::Tensor());
    } else {
      exp_avg_.push_back(alloc(n));
      exp_avg_sq_.push_back(alloc(n));
    }
  }
}

std::int64_t FlatOptimizer::state_numel() const {
  std::int64_t n = 0;
  for (const auto& t : exp_avg_) n += t.defined() ? t.numel() : 0;
  for (const auto& t : exp_avg_sq_) n += t.numel();
  return n;
}

void FlatOptimizer::step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads) {
  TORCH_INTERNAL_ASSERT(params.size() == exp_avg_.size() && grads.size() == params.size());
  torch::NoGradGuard no_grad;
  ++step_;
  const Kind kind = kind_of(config_.name);
  const double lr = config_.lr;
  const double wd = config_.weight_decay;
  const double b1 = config_.betas[0];
  const double b2 = config_.betas[1];
  const double eps = config_.eps;
  const double bc1 = 1 - std::pow(b1, static_cast<double>(step_));
  const double bc2 = 1 - std::pow(b2, static_cast<double>(step_));
  const double step_size = lr / bc1;
  const double sqrt_bc2 = std::sqrt(bc2);

  for (std::size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& p = params[i];
    const torch::Tensor& g = grads[i];
    TORCH_INTERNAL_ASSERT(p.is_contiguous() && g.is_contiguous() && p.numel() == g.numel());
    if (p.numel() == 0) continue;
    if (!host_) {
      // torch::optim's formulas, as its C++ implementation writes them, over chunks of the flat buffer
      // so that the temporaries (the denominator, a weight-decayed gradient) stay at kStepChunk
      // elements instead of the buffer's size. Element-wise, so the chunking changes no result.
      const std::int64_t numel = p.numel();
      for (std::int64_t off = 0; off < numel; off += kStepChunk) {
        const std::int64_t len = std::min(kStepChunk, numel - off);
        torch::Tensor pc = p.narrow(0, off, len), gc = g.narrow(0, off, len);
        torch::Tensor mc = exp_avg_[i].defined() ? exp_avg_[i].narrow(0, off, len) : torch::Tensor();
        if (kind == Kind::sgd) {
          torch::Tensor d_p = wd != 0 ? gc.add(pc, wd) : gc;
          if (config_.momentum != 0) {
            mc.mul_(config_.momentum).add_(d_p);
            d_p = mc;
          }
          pc.add_(d_p, -lr);
          continue;
        }
        torch::Tensor vc = exp_avg_sq_[i].narrow(0, off, len);
        if (kind == Kind::adamw && wd != 0) pc.mul_(1 - lr * wd);
        torch::Tensor grad = (kind == Kind::adam && wd != 0) ? gc.add(pc, wd) : gc;
        mc.mul_(b1).add_(grad, 1 - b1);
        vc.mul_(b2).addcmul_(grad, grad, 1 - b2);
        torch::Tensor denom = (vc.sqrt() / sqrt_bc2).add_(eps);
        pc.addcdiv_(mc, denom, -step_size);
      }
      continue;
    }
    // Host: the same math as one allocation-free loop (no device memory, no temporaries).
    TORCH_INTERNAL_ASSERT(p.scalar_type() == torch::kFloat32 && g.scalar_type() == torch::kFloat32);
    float* pp = p.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    float* m = exp_avg_[i].defined() ? exp_avg_[i].data_ptr<float>() : nullptr;
    float* v = (kind != Kind::sgd) ? exp_avg_sq_[i].data_ptr<float>() : nullptr;
    const float flr = static_cast<float>(lr), fwd = static_cast<float>(wd);
    const float fb1 = static_cast<float>(b1), fb2 = static_cast<float>(b2);
    const float om1 = static_cast<float>(1 - b1), om2 = static_cast<float>(1 - b2);
    const float fstep = static_cast<float>(-step_size), fsqrt_bc2 = static_cast<float>(sqrt_bc2);
    const float feps = static_cast<float>(eps), fmom = static_cast<float>(config_.momentum);
    const float decay = static_cast<float>(1 - lr * wd);
    at::parallel_for(0, p.numel(), 16384, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t k = begin; k < end; ++k) {
        float grad = gp[k];
        if (kind == Kind::sgd) {
          if (wd != 0) grad = grad + fwd * pp[k];
          if (m != nullptr) {
            m[k] = m[k] * fmom + grad;
            grad = m[k];
          }
          pp[k] = pp[k] + (-flr) * grad;
          continue;
        }
        if (kind == Kind::adamw && wd != 0) pp[k] = pp[k] * decay;
        if (kind == Kind::adam && wd != 0) grad = grad + fwd * pp[k];
        m[k] = m[k] * fb1 + om1 * grad;
        v[k] = v[k] * fb2 + om2 * (grad * grad);
        const float denom = std::sqrt(v[k]) / fsqrt_bc2 + feps;
        pp[k] = pp[k] + fstep * (m[k] / denom);
      }
    });
  }
}

}  // namespace zeroplan::exec
