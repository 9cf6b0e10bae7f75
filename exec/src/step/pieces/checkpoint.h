// The executor's pieces (pieces.h lists them): Checkpoint (checkpoint.cpp).
#pragma once

#include "context.h"
#include "param_residency.h"
#include "precision.h"
#include "optimizer_step.h"

namespace zeroplan::exec::pieces {

class Checkpoint {
 public:
  Checkpoint(Ctx& c, ParamResidency& params, OptimizerStep& opt, Precision& precision);
  // Collective: every rank writes its shard of the states after `step` steps into dir/step-<step>/, then
  // rank 0 the manifest (a checkpoint exists exactly when its manifest does).
  void save(const std::string& dir, std::int64_t step);
  // This rank's states from dir's newest checkpoint, resharded for this run's ranks and zero stage;
  // returns its step. Throws ExecError naming what does not match (units, dtype, optimizer, and unless
  // `other_run` the run identity: model, seed, global batch).
  std::int64_t load(const std::string& dir, bool other_run = false);

 private:
  int shards() const;  // chunks per unit in this run's layout: the ranks at stages 1-3, else 1
  torch::Tensor owned_params();
  Ctx& c_;
  ParamResidency& params_;
  OptimizerStep& opt_;
  Precision& precision_;
};

}  // namespace zeroplan::exec::pieces
