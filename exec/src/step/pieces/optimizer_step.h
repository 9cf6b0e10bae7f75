// The executor's pieces (pieces.h lists them): OptimizerStep (optimizer_step.cpp).
#pragma once

#include "context.h"
#include "param_residency.h"
#include "grad_sync.h"
#include "precision.h"

namespace zeroplan::exec::pieces {

class OptimizerStep {
 public:
  OptimizerStep(Ctx& c, ParamResidency& params, GradSync& grads, Precision& precision);
  // Steps this rank's shard with the learning rate x lr_scale and brings the updated parameters to where
  // the units compute; false when the step was skipped (non-finite gradients): parameters and optimizer
  // state untouched.
  bool step(double lr_scale = 1.0);
  // Plan::steps_beside_last_reduce_scatter: the executor leaves the last reduce-scatter in flight
  // (GradSync::finish_microbatch(1)) and calls step() without GradSync::finish_step, which step() waits.
  bool steps_beside_last_reduce_scatter() const { return c_.plan.steps_beside_last_reduce_scatter(); }
  std::int64_t stepped_numel() const { return stepped_; }
  // Checkpoints (checkpoint.cpp): the master shard (undefined without one) and the optimizer.
  torch::Tensor& master() { return master_; }
  FlatOptimizer& optimizer() { return *optimizer_; }

 private:
  bool step_master_by_unit(double lr_scale);  // 16-bit gradients into the fp32 master, one unit at a time
  void step_beside_last_reduce_scatter(double lr_scale);  // stage 3: landed units first, then the rest
  void gradients_home();                      // offload.optimizer: the gradient shard copied to host_grad_
  torch::Tensor grad_of(int u);               // this rank's final gradient of unit u where the step reads it
  // optimizer.max_grad_norm: what to multiply this rank's gradients by (1: no clipping), from the global
  // L2 norm of every gradient of the model; `scale` takes `grads` to their true values.
  double clip_factor(const std::vector<torch::Tensor>& grads, double scale);
  void sync_params();  // stages 1-2: every rank's updated chunks all-gathered into the full parameters
  void master_to_params();  // the updated master rounded into the compute copy (stages 0 and 3)
  Ctx& c_;
  ParamResidency& params_;
  GradSync& grads_;
  Precision& precision_;
  int stage_ = 0;
  bool separate_master_ = false;  // a master shard apart from the parameters: fp32 beside 16-bit
                                  // params, or offload.optimizer with parameters on the device
  std::int64_t stepped_ = 0;
  torch::Tensor master_;          // the master shard, on the host with offload.optimizer
  torch::Tensor host_grad_;       // offload.optimizer: host copy of the gradient shard for the step
  std::unique_ptr<FlatOptimizer> optimizer_;
  std::vector<std::vector<int>> gather_buckets_;  // stages 1-2: units per all-gather (allgather_buckets)
};

}  // namespace zeroplan::exec::pieces
