// The executor's pieces (pieces.h lists them): ActivationOffload (activation_offload.cpp).
#pragma once

#include <deque>
#include <unordered_map>
#include <unordered_set>

#include "context.h"

namespace zeroplan::exec::pieces {

// Activation offload for one microbatch's units (activation_offload.cpp): the saved tensors the policy
// picks go to the host on the side lane and come back before their unit's backward.
class ActivationOffload final : public saved_tensors::Handler {
 public:
  struct Entry;
  struct Slot;
  struct Seen;
  explicit ActivationOffload(Ctx& c);
  ~ActivationOffload() override;
  bool on() const { return ratio_ > 0; }
  // Unit u's forward runs while the returned scope lives (nothing when off or checkpointed); then
  // end_forward, for every unit. `in`, the unit's input, is kept on the device (undefined: found out at
  // end_forward).
  std::optional<saved_tensors::Scope> capture(int u, bool checkpointed, const torch::Tensor& in = {});
  // The same without the scope, for a driver that routes the saved tensors itself (the hook driver: from
  // Python's saved_tensors_hooks to hooks()): true when unit u's saved tensors are to be captured now.
  bool begin_capture(int u, bool checkpointed, const torch::Tensor& in = {});
  void end_forward(int u, const torch::Tensor& in, const torch::Tensor& out);
  void before_bwd(int u);  // u's first tensors copied back within the window
  void after_bwd(int u);
  std::vector<OffloadedActivations> summary() const;  // per unit, the last microbatch's picks

  std::unique_ptr<torch::autograd::SavedVariableHooks> hooks() override;
  std::shared_ptr<Slot> pack(const torch::Tensor& t);
  torch::Tensor unpack(Slot& slot);

 private:
  struct UnitState {
    std::vector<std::shared_ptr<Slot>> slots;     // offloaded, saved in the forward, until end_forward
    std::unordered_map<const void*, Seen> seen;   // per storage saved in the forward, until end_forward
    std::vector<std::shared_ptr<Entry>> entries;  // sent to the host in the order saved, until the backward
    int tensors = 0, offloaded = 0;
    std::int64_t bytes = 0, offloaded_bytes = 0;
    bool captured = false;  // its forward ran inside capture(), end_forward not yet
    int next = -1;          // the backward: the next entry to copy back (entries are needed last first)
  };
  void send_pending();
  void release_oldest();
  void copy_back(Entry& e);
  void issue_ahead();
  Ctx& c_;
  double ratio_;
  OffloadPolicy policy_{0};
  int capturing_ = 0;
  std::vector<UnitState> units_;
  std::unordered_set<const void*> kept_;         // the capturing unit's storages kept anyway
  std::shared_ptr<Entry> pending_;               // the forward: chosen, its copy out not yet started
  std::deque<std::shared_ptr<Entry>> in_flight_;  // the forward: copies out whose device storage is held
  std::int64_t in_flight_bytes_ = 0;
  int restoring_ = -1;                           // the unit whose backward copies back
  std::int64_t ahead_bytes_ = 0;                 // copied back, not yet unpacked
  std::uint64_t last_ticket_ = 0;
};

}  // namespace zeroplan::exec::pieces
