// Loss scaling for 16-bit training, torch.cuda.amp.GradScaler's rules (its constants by default):
// dynamic: start 2^16, x2 after growth_interval (2000) clean steps in a row, x0.5 and skip the step on
// any inf/NaN; fixed: a constant scale, gradients unscaled, never skipped (DeepSpeed's static scale).
// Sharded (fairscale ShardedGradScaler): each rank checks only its own gradient shard and the ranks agree
// with one 4-byte all-reduce, so every rank skips the same steps.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "zeroplan/exec/communicator.h"
#include "zeroplan/profiles/plan.h"

namespace zeroplan::exec {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;
};

class LossScaler {
 public:
  // mode none: scale 1, nothing checked. The scale and counters live on `device` (as GradScaler's).
  LossScaler(const LossScale& config, torch::Device device, LossScalerOptions options = {});

  bool enabled() const { return mode_ != LossScale::Mode::none; }
  bool dynamic() const { return mode_ == LossScale::Mode::dynamic; }
  double scale() const;  // what the loss gradient is multiplied by this step
  const LossScalerOptions& options() const { return options_; }
  void set_growth_interval(int steps);  // REQUIRES: steps >= 1

  // Divides `grads` (this rank's final gradients, floating, on the scaler's device or the host) by the
  // scale in place and, when dynamic, agrees with the other ranks through `comm` (null: this rank only)
  // whether any rank saw an inf/NaN. Returns true when the step is to be skipped (dynamic only).
  // unscale false: only checks (the gradients keep the scale; multiply by inv_scale() where they are
  // used, as the fp32 master's chunked step does with its fp32 copies).
  bool unscale_and_check(const std::vector<torch::Tensor>& grads, Communicator* comm, bool unscale = true);
  torch::Tensor inv_scale() const { return scale_.reciprocal(); }  // fp32 [1], on the scaler's device
  // Dynamic: grows or backs off the scale after a step per `skipped` (unscale_and_check's answer).
  void update(bool skipped);
  int clean_steps() const;  // consecutive steps without inf/NaN since the last change of the scale
  void load_state(double scale, int clean_steps);  // a checkpoint's (mode none: ignored)

 private:
  LossScale::Mode mode_;
  LossScalerOptions options_;
  torch::Tensor scale_;           // fp32 [1]
  torch::Tensor growth_tracker_;  // int32 [1]
  torch::Tensor found_inf_;       // fp32 [1]: after the agreement, > 0 on every rank if any rank overflowed
};

}  // namespace zeroplan::exec
