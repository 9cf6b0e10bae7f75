// The device behind the executor: its memory pool (measured, optionally limited), the host pool that
// offloaded state lives in, copies between them, timers' synchronisation and the random state.
// CPU: the device pool is the counting CPU allocator (every tensor ATen allocates), the host pool a
// separate arena the executor owns. CUDA: the caching allocator's statistics and pinned host memory.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace zeroplan::exec {

// The host pool: tensors whose memory the device pool never sees (pinned on CUDA). Thread-safe.
class HostPool {
 public:
  // Raw memory (aligned malloc on CPU) of exactly the requested bytes; reserved == live.
  using AllocFn = void* (*)(std::size_t bytes);
  using FreeFn = void (*)(void* ptr);
  HostPool(AllocFn alloc, FreeFn free);
  // Blocks from a caching allocator that rounds every request up to a power of two and keeps a freed
  // block for the next request of the same power of two (PyTorch's CachingHostAllocator, which
  // DeepSpeed's and FSDP's pin_memory() go through): reserved_bytes() follows that rule.
  explicit HostPool(c10::Allocator* pow2_caching);
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // A 1-D fp32 (or `dtype`) CPU tensor of numel zeros. The memory returns to the pool when the last
  // reference dies; the pool must outlive its tensors.
  torch::Tensor zeros(std::int64_t numel, torch::ScalarType dtype = torch::kFloat32);
  torch::Tensor empty(std::int64_t numel, torch::ScalarType dtype = torch::kFloat32);

  // Requested bytes of the live tensors, and their peak.
  std::int64_t live_bytes() const;
  std::int64_t peak_bytes() const;
  void reset_peak();  // peak := live
  // What the memory behind the pool holds: live bytes for raw memory; with a caching allocator, per
  // power of two the most blocks ever live at once times its size (blocks are never given back).
  std::int64_t reserved_bytes() const;

 private:
  void on_alloc(std::int64_t bytes);
  void on_free(std::int64_t bytes);

  AllocFn alloc_ = nullptr;
  FreeFn free_ = nullptr;
  c10::Allocator* caching_ = nullptr;
  mutable std::mutex mutex_;
  std::int64_t live_ = 0;
  std::int64_t peak_ = 0;
  std::int64_t reserved_ = 0;
  std::array<std::int64_t, 64> live_blocks_{};  // caching: live blocks per power of two
  std::array<std::int64_t, 64> most_blocks_{};  // caching: the most ever live at once
};

// The side lane: copies that overlap compute (activation offload's). On CPU a thread of its own that
// copies contiguous bytes (a memcpy: no intra-op threads); on CUDA a stream of its own, each copy queued
// after what the compute stream had queued. submit() keeps both tensors referenced until wait() for its
// ticket (or a later one) returns on the caller's thread, so no memory is freed on the lane and the
// compute lane may use dst and drop src after it.
enum class CopyDirection { d2h, h2d };

// Seconds a side lane spent copying each way: the run adds them to its `d2h` and `h2d` phases, the
// simulator's lanes of those names.
struct SideLaneSeconds {
  double d2h = 0, h2d = 0;
  double& operator[](CopyDirection d) { return d == CopyDirection::d2h ? d2h : h2d; }
};

class SideLane {
 public:
  virtual ~SideLane() = default;
  // dst <- src, both contiguous and of the same byte size, `dir` off or onto the device. Returns the
  // copy's ticket (1, 2, ...).
  virtual std::uint64_t submit(const torch::Tensor& dst, const torch::Tensor& src, CopyDirection dir) = 0;
  // The calling thread waits until the copy `ticket` and every earlier one are done; the lane then holds
  // none of their tensors.
  virtual void wait(std::uint64_t ticket) = 0;
  // Seconds the lane spent copying each way since it was made (CUDA: the copies finished so far).
  virtual SideLaneSeconds busy_s() const = 0;
};

// A refused device allocation (the limit was hit).
struct DeviceRefusal {
  std::int64_t need_bytes = 0;
  std::int64_t limit_bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;               // "cpu", "cuda:0"
  virtual torch::Device torch_device() const = 0;
  virtual void synchronize() = 0;                     // wait for everything queued on the device
  // Wait for the compute this thread queued (CUDA: its current stream), leaving side lanes, copies on
  // other streams and collectives running: what a unit's compute span times, so timing does not
  // serialise the overlap the plan relies on. CPU: nothing to wait for.
  virtual void wait_compute() = 0;

  // Device pool.
  virtual std::int64_t live_bytes() const = 0;
  virtual std::int64_t peak_bytes() const = 0;
  virtual void reset_peak() = 0;
  // 0 removes the limit. Past it, allocations fail (an exception out of the allocating op) and
  // is_out_of_memory() recognises the exception.
  virtual void set_limit(std::int64_t bytes) = 0;
  virtual std::int64_t limit() const = 0;
  // Whether `e` is this device refusing an allocation (the limit, or a real out-of-memory); if so,
  // what was needed.
  virtual bool is_out_of_memory(const std::exception& e, DeviceRefusal* out) const = 0;

  virtual HostPool& host_pool() = 0;

  // dst (host) <- src (device) and dst (device) <- src (host); same numel. May be asynchronous on
  // CUDA; wait_copies() waits for all of them.
  virtual void copy_d2h(const torch::Tensor& dst, const torch::Tensor& src) = 0;
  virtual void copy_h2d(const torch::Tensor& dst, const torch::Tensor& src) = 0;
  virtual void wait_copies() = 0;

  virtual SideLane& side_lane() = 0;

  // Random state of the device's default generator (dropout), for checkpoint recompute.
  virtual torch::Tensor rng_state() = 0;
  virtual void set_rng_state(const torch::Tensor& state) = 0;
};

// "cpu" or "cuda[:i]". Throws ExecError when the device is unknown or unavailable in this build or on
// this machine. The CPU device installs the counting allocator on first use (process-wide).
std::unique_ptr<Device> make_device(const std::string& name);

}  // namespace zeroplan::exec
