// The executor's pieces (pieces.h lists them): ActivationOffload (activation_offload.cpp).
#pragma once

#include "context.h"

namespace zeroplan::exec::pieces {

// Activation offload for one microbatch's units (activation_offload.cpp): the saved tensors the policy
// picks go to the host on the side lane and come back before their unit's backward.
class ActivationOffload final : public saved_tensors::Handler {
 public:
  struct Entry;
  struct Slot;
  explicit ActivationOffload(Ctx& c);
  ~ActivationOffload() override;
  bool on() const { return ratio_ > 0; }
  // Unit u's forward runs while the returned scope lives (nothing when off or checkpointed); then
  // end_forward, for every unit.
  std::optional<saved_tensors::Scope> capture(int u, bool checkpointed);
  // The same without the scope, for a driver that routes the saved tensors itself (the hook driver: from
  // Python's saved_tensors_hooks to hooks()): true when unit u's saved tensors are to be captured now.
  bool begin_capture(int u, bool checkpointed);
  void end_forward(int u, const torch::Tensor& in, const torch::Tensor& out);
  void before_bwd(int u);  // u's tensors back on the device; earlier units prefetched within the budget
  void after_bwd(int u);
  std::vector<OffloadedActivations> summary() const;  // per unit, the last microbatch's picks

  std::unique_ptr<torch::autograd::SavedVariableHooks> hooks() override;
  torch::Tensor unpack(Slot& slot);

 private:
  struct UnitState {
    std::vector<std::shared_ptr<Slot>> slots;     // saved in the forward, until end_forward
    std::vector<std::shared_ptr<Entry>> entries;  // sent to the host, until restored
    int tensors = 0, offloaded = 0;
    std::int64_t bytes = 0, offloaded_bytes = 0;
    bool let_go = false;
    bool captured = false;  // its forward ran inside capture(), end_forward not yet
  };
  void let_go(int u);
  void copy_back(int u);
  Ctx& c_;
  double ratio_;
  OffloadPolicy policy_{0};
  int capturing_ = 0;
  std::vector<UnitState> units_;
  std::vector<int> points_;  // prefetch_points for this microbatch's backward
  std::uint64_t last_ticket_ = 0;
};

}  // namespace zeroplan::exec::pieces
