// The executor's pieces (pieces.h lists them): ReplicaSync (localsgd.cpp).
#pragma once

#include "context.h"
#include "param_residency.h"
#include "grad_sync.h"

namespace zeroplan::exec::pieces {

class ReplicaSync {
 public:
  ReplicaSync(Ctx& c, ParamResidency& params, GradSync& grads);
  // Before step `step`'s first microbatch: tells GradSync which ranks all-reduce gradients.
  void begin_step(std::int64_t step);
  int grad_ranks() const { return grad_ranks_; }  // ranks whose gradients are summed this step
  void after_step(std::int64_t step);             // parameters averaged, slow update, when due

 private:
  Ctx& c_;
  ParamResidency& params_;
  GradSync& grads_;
  std::unique_ptr<Communicator> node_;  // this node's ranks, when 1 < ranks_per_node < world
  int grad_ranks_ = 1;
  torch::Tensor slow_momentum_, old_params_;  // SlowMo, full size on every rank
};

}  // namespace zeroplan::exec::pieces
