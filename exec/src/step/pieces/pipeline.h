// The executor's pieces (pieces.h lists them): Pipeline (pipeline.cpp).
#pragma once

#include "context.h"
#include "param_residency.h"
#include "grad_sync.h"
#include "activations.h"

namespace zeroplan::exec::pieces {

// Pipeline parallelism (fairscale Pipe / GPipe, and 1F1B), the simulator's sim/src/lowering/pipeline.cpp.
// Ranks are stage-major, as the simulator assumes: rank = stage x dp + replica, so a stage's data-parallel
// group is dp consecutive ranks (Communicator::split(dp)) and replica d's pipeline is ranks d, dp + d, ...
// Activations go forward and their gradients back point to point on the world communicator (Gloo send /
// recv between the same replica's ranks of neighbouring stages); a header with the shape and dtype goes
// before each activation.
class Pipeline {
 public:
  // Balance: the plan's units per stage (pipeline_balance's list); time/memory balances need the model's
  // profile, which `zeroplan run` resolves into a list before the executor starts.
  Pipeline(const Plan& plan, int model_units, Communicator& world);
  Communicator& dp() { return *dp_; }  // this stage's data-parallel group
  StageUnits units() const;
  int stage() const { return stage_; }
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ + 1 == stages_; }
  const std::vector<PipelineOp>& order() const { return order_; }
  bool checkpointed(int mb) const { return pipeline_checkpointed(plan_, mb); }
  void attach(Ctx& c, const zoo::Model& model);  // the tied weights this stage shares with another

  torch::Tensor recv_input(int mb);                      // from the previous stage
  void send_output(int mb, const torch::Tensor& y);      // to the next stage
  torch::Tensor recv_grad(int mb);                       // the gradient of what send_output sent
  void send_grad(int mb, const torch::Tensor& g);        // the gradient of what recv_input returned
  // Tied weights: a borrower's replica gradient goes to its owner (and is zeroed here); the owner adds it
  // to its own before the unit's gradient is reduced (stages 0-1: once, on the last microbatch).
  void tied_grads_out(int u, GradSync& grads, bool last_micro);
  void tied_grads_in(int u, GradSync& grads, bool last_micro);
  void tied_params_after_step(ParamResidency& params);   // the owner's updated weights to the replicas
  double share_loss(double loss);                        // the last stage's loss, on every stage
  void finish_step();                                    // every send waited

 private:
  int tag(int kind, int mb, int k = 0) const { return kind * 1000000 + mb * 64 + k; }
  int peer(int stage) const { return stage * dp_size_ + replica_; }
  int stage_of(int unit) const;
  bool tied_due(bool last_micro) const;
  void waited(const char* what, double t0_s, int mb = -1);
  struct Tie {
    int local_unit = 0;       // this stage's unit: the owner's or the borrower's
    std::int64_t offset = 0;  // of the weight in that unit's flat parameter
    std::int64_t numel = 0;
    int other_stage = 0;
    int k = 0;                // the tie's index (tags)
    bool owner = false;
  };
  const Plan plan_;
  Communicator& world_;
  std::unique_ptr<Communicator> dp_own_;
  Communicator* dp_ = nullptr;
  int stages_ = 1, stage_ = 0, dp_size_ = 1, replica_ = 0;
  std::vector<int> balance_, first_;
  std::vector<PipelineOp> order_;
  Ctx* c_ = nullptr;
  std::vector<Tie> ties_;
  std::vector<std::vector<std::int64_t>> sent_shape_;  // per microbatch: the output's shape
  std::vector<torch::ScalarType> sent_dtype_;
  std::vector<std::unique_ptr<Work>> act_sends_;         // per microbatch: waited once its gradient came back
  std::unique_ptr<Work> grad_send_;                      // one in flight
  torch::Tensor grad_sent_;
  std::unique_ptr<Work> tied_send_;                      // one in flight
  torch::Tensor tied_sent_;
  std::vector<std::unique_ptr<Work>> other_sends_;       // waited at the end of the step
  std::vector<torch::Tensor> other_sent_;
};

}  // namespace zeroplan::exec::pieces
