// Adam, AdamW and SGD (with momentum) stepping flat buffers with PyTorch's fused kernels
// (at::_fused_adam_, _fused_adamw_, _fused_sgd_: what torch.optim's fused=True runs), one call over
// all segments. The kernels update in place and allocate nothing, so a step needs no memory beyond the
// state, on the device (stages 0-3) as on the host (offload.optimizer). Their math is torch.optim's;
// parity tests compare every stage against a single process stepping torch::optim.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
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

  // One step. params[i] and grads[i] are 1-D fp32 contiguous with segment_numels[i] elements; params
  // are updated in place (their views stay valid).
  void step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads);

  std::int64_t state_numel() const;  // all states of all segments (the step counters not included)
  std::int64_t steps() const { return step_; }

 private:
  Optimizer config_;
  std::int64_t step_ = 0;
  std::vector<torch::Tensor> exp_avg_;     // adam: m; sgd: momentum buffer (undefined without momentum)
  std::vector<torch::Tensor> exp_avg_sq_;  // adam: v
  std::vector<torch::Tensor> state_step_;  // adam: the step count, one element per segment
};

}  // namespace zeroplan::exec
