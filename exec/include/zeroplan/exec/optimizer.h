// Adam, AdamW and SGD (with momentum) stepping flat buffers with PyTorch's fused kernels
// (at::_fused_adam_, _fused_adamw_, _fused_sgd_: what torch.optim's fused=True runs), one call over
// all segments. The kernels update in place and allocate nothing, so a step needs no memory beyond the
// state, on the device (stages 0-3) as on the host (offload.optimizer). Their math is torch.optim's;
// parity tests compare every stage against a single process stepping torch::optim.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zeroplan/profiles/plan.h"

namespace zeroplan::exec {

class FlatOptimizer {
 public:
  // Allocates zeroed state (K x segment sizes, plus a one-element step counter per segment, which the
  // fused kernels read where the parameters live) with `alloc(numel)`: the device pool, or the host pool
  // when the optimizer is offloaded.
  FlatOptimizer(const Optimizer& config, const std::vector<std::int64_t>& segment_numels,
                const std::function<torch::Tensor(std::int64_t)>& alloc);

  // One step at the configured learning rate x lr_scale (AdaScale's gain). params[i] and grads[i] are
  // 1-D fp32 contiguous with segment_numels[i] elements; params are updated in place (their views stay
  // valid).
  void step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
            double lr_scale = 1.0);
  // The same step in pieces: begin_step() once, then step_range for consecutive ranges covering every
  // segment, each param_part/grad_part the elements [offset, offset + numel) of segment `segment` (the
  // kernels are elementwise: the result is step()'s, bit for bit). What lets a 16-bit gradient be read
  // into fp32 a unit at a time instead of all at once.
  void begin_step();
  void step_range(std::size_t segment, std::int64_t offset, const torch::Tensor& param_part,
                  const torch::Tensor& grad_part, double lr_scale = 1.0);

  std::int64_t state_numel() const;  // all states of all segments (the step counters not included)
  std::int64_t steps() const { return step_; }
  // Checkpoints: the state kinds ("exp_avg", "exp_avg_sq"; SGD with momentum "momentum"; none), each as
  // one tensor over the segments back to back (a copy), and loading them back; the step count.
  std::vector<std::string> state_kinds() const;
  torch::Tensor state(std::size_t kind) const;
  void set_state(std::size_t kind, const torch::Tensor& flat);  // REQUIRES: flat has every segment's elements
  void set_steps(std::int64_t steps);

 private:
  Optimizer config_;
  std::int64_t step_ = 0;
  std::vector<torch::Tensor> exp_avg_;     // adam: m; sgd: momentum buffer (undefined without momentum)
  std::vector<torch::Tensor> exp_avg_sq_;  // adam: v
  std::vector<torch::Tensor> state_step_;  // adam: the step count, one element per segment
};

// fairscale AdaScale's estimator with its defaults (scale S = samples, smoothing max(1 - S / 1000, 0),
// debiased moving averages). From the sum over the S gradient samples g_i (one per rank and microbatch,
// each the gradient of that microbatch's mean loss) of |g_i|^2 and the averaged gradient's |g|^2:
//   var = sum |g_i|^2 / (S - 1) - |g|^2 S / (S - 1),  sqr = |g|^2 - var / S  (var >= 1e-6, sqr >= 0),
// averaged over the steps; gain = (var + sqr) / (var / S + sqr) multiplies the step's learning rate.
// Identical samples give 1, independent ones of equal norm about S. One sample: always 1.
class AdaScaleGain {
 public:
  explicit AdaScaleGain(double samples);
  double update(double sum_sample_sqr, double mean_sqr);  // this step's gain
  double samples() const { return samples_; }

 private:
  double samples_, smoothing_;
  double sqr_biased_ = 0, var_biased_ = 0, unbias_ = 0;
};

}  // namespace zeroplan::exec
