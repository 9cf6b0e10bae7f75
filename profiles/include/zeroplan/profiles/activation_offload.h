// Activation offload (hfai CPUOffload's offload_ratio) decided one saved tensor at a time, the same way in
// the executor and in the simulator.
//
// Which tensors go to the host: over one microbatch's forward, unit after unit (checkpointed units save
// nothing), each tensor a unit alone keeps (ModelProfile's UnitProfile::saved_tensors: autograd's saved
// tensors less the unit's input, output, parameters and buffers, one per storage, in the order saved)
// goes to the host when, with it, the bytes sent stay within `ratio` of the bytes seen so far. Ratio 1
// sends everything, 0 nothing, 0.5 about every other byte from the first unit on, so the device keeps
// about 1 - ratio of them at every point of the forward.
//
// When they come back: before unit u's backward all of u's offloaded tensors are on the device (copied
// back then if not yet); unit u-1's, u-2's ... are prefetched at that point while the bytes prefetched
// ahead of need stay within the budget (offload.activations_prefetch_bytes; -1: the most one unit sends).
#pragma once

#include <cstdint>
#include <vector>

namespace zeroplan {

class OffloadPolicy {
 public:
  explicit OffloadPolicy(double ratio) : ratio_(ratio) {}
  // Whether the next tensor (of `bytes`) goes to the host.
  bool take(std::int64_t bytes);
  void reset() { seen_ = sent_ = 0; }

 private:
  double ratio_;
  std::int64_t seen_ = 0, sent_ = 0;
};

// Per unit, which of its saved tensors go to the host (true), for tensors[u] in the order saved; units
// with keeps[u] false (checkpointed) offload nothing and do not count.
std::vector<std::vector<bool>> offloaded_tensors(const std::vector<std::vector<std::int64_t>>& tensors,
                                                 const std::vector<bool>& keeps, double ratio);

// The prefetch budget in bytes: `prefetch_bytes` when >= 0, else the largest of `unit_bytes`.
std::int64_t prefetch_budget(std::int64_t prefetch_bytes, const std::vector<std::int64_t>& unit_bytes);

// For each unit v with offloaded bytes, the unit w >= v before whose backward its copy back starts
// (-1 for units that offload nothing), with unit_bytes[v] the bytes unit v sent to the host.
std::vector<int> prefetch_points(const std::vector<std::int64_t>& unit_bytes, std::int64_t budget);

}  // namespace zeroplan
