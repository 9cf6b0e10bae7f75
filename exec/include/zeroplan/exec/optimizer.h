// Adam, AdamW and SGD (with momentum) stepping flat buffers, with torch::optim's math (same formulas,
// same order), so a sharded run matches a single process that uses torch::optim.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "zeroplan/profiles/plan.h"

namespace zeroplan::exec {

// Elements per chunk of a device step: its temporaries peak at two chunks (4 bytes each), 8 MiB.
inline constexpr std::int64_t kStepChunk = 1 << 20;

class FlatOptimizer {
 public:
  // Allocates zeroed state (K x segment sizes) with `alloc(numel)`. host: the state and every
  // segment live in the host pool; the step is then an allocation-free loop (no device memory).
  FlatOptimizer(const Optimizer& config, const std::vector<std::int64_t>& segment_numels,
                const std::function<torch::Tensor(std::int64_t)>& alloc, bool host);

  // One step. params[i] and grads[i] are 1-D fp32 contiguous with segment_numels[i] elements; params
  // are updated in place (their views stay valid).
  void step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads);

  std::int64_t state_numel() const;  // all states of all segments
  std::int64_t steps() const { return step_; }

 private:
  Optimizer config_;
  bool host_;
  std::int64_t step_ = 0;
  std::vector<torch::Tensor> exp_avg_;     // adam: m; sgd: momentum buffer
  std::vector<torch::Tensor> exp_avg_sq_;  // adam: v
};

}  // namespace zeroplan::exec
