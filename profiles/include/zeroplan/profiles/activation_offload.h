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
// The device holds an offloaded tensor only while it is copied out (the forward) and from shortly before
// autograd unpacks it (the backward), within a window of `offload.activations_prefetch_bytes`:
//   forward   each chosen tensor is copied out when the next one is chosen (or the unit's forward ends);
//             the older copies in flight are waited for and let go while more than the window is in
//             flight (-1 or 0: only the newest), all of a unit's when its forward ends;
//   backward  when unit u's backward starts, and after each unpack, the next tensors in the order needed
//             (the reverse of the order saved) are copied back while the bytes copied ahead of need stay
//             within the window (-1: one tensor ahead; 0: none, each copied when unpacked).
// forward_window and backward_window replay those rules: the most bytes of a unit's offloaded tensors on
// the device at once, for the simulator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zeroplan {

class OffloadPolicy {
 public:
  explicit OffloadPolicy(double ratio) : ratio_(ratio) {}
  // Whether the next tensor (of `bytes`) goes to the host.
  bool take(std::int64_t bytes);
  // As if a tensor of `bytes` taken (or not) had never been offered.
  void forget(std::int64_t bytes, bool taken) {
    if (bytes <= 0) return;
    seen_ -= bytes;
    if (taken) sent_ -= bytes;
  }
  void reset() { seen_ = sent_ = 0; }

 private:
  double ratio_;
  std::int64_t seen_ = 0, sent_ = 0;
};

// Per unit, which of its saved tensors go to the host (true), for tensors[u] in the order saved; units
// with keeps[u] false (checkpointed) offload nothing and do not count.
std::vector<std::vector<bool>> offloaded_tensors(const std::vector<std::vector<std::int64_t>>& tensors,
                                                 const std::vector<bool>& keeps, double ratio);

// The two rules, as the executor applies them and the windows below replay them:
// the forward lets the oldest copy out in flight go while more than one is in flight and they exceed the
// window (-1 and 0: only the newest stays);
inline bool let_oldest_go(std::size_t in_flight, std::int64_t in_flight_bytes, std::int64_t prefetch_bytes) {
  return in_flight > 1 && in_flight_bytes > (prefetch_bytes > 0 ? prefetch_bytes : 0);
}
// the backward copies the next tensor back ahead of need when it fits beside the bytes already ahead
// (-1: one tensor ahead; 0: none).
inline bool copy_back_ahead(std::int64_t ahead_bytes, std::int64_t bytes, std::int64_t prefetch_bytes) {
  return prefetch_bytes < 0 ? ahead_bytes == 0 : ahead_bytes + bytes <= prefetch_bytes;
}

// Unit by unit, `sizes` a unit's offloaded tensors in the order saved: the most bytes of them on the
// device at once in its forward (the tensors in flight, and the next one as it is made).
std::int64_t forward_window(const std::vector<std::int64_t>& sizes, std::int64_t prefetch_bytes);
// The same in its backward: the tensor being unpacked and those copied back ahead of it.
std::int64_t backward_window(const std::vector<std::int64_t>& sizes, std::int64_t prefetch_bytes);

// A unit's backward peak above the bytes live before it when the `picked` of its saved tensors (`sizes`,
// in the order saved) are on the host, from the profile's timeline of that backward with every saved
// tensor resident (UnitProfile::bwd_unpack_order and a peaks list: positions in the order first
// unpacked; the peak before the first unpack and after each). Every picked tensor counts from its copy
// back (ahead of need in the reverse of the order saved within `prefetch_bytes`, as the executor issues
// them, or when unpacked) to its free, which the measured peaks already subtract: at each segment, its
// peak plus every picked byte copied back so far.
std::int64_t offloaded_backward_peak(const std::vector<std::int64_t>& sizes, const std::vector<bool>& picked,
                                     const std::vector<std::int64_t>& order, const std::vector<std::int64_t>& peaks,
                                     std::int64_t prefetch_bytes);

}  // namespace zeroplan
