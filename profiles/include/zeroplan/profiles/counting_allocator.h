// Counting CPU allocator: measures every byte ATen allocates on the CPU ("device" pool on CPU).
//
// CountingAllocator wraps the CPU allocator current at construction (c10::GetCPUAllocator()) and counts
// live and peak bytes of what it hands out; ScopedCpuAllocator installs one with c10::SetCPUAllocator
// and restores the previous allocator when it goes out of scope (installs nest, LIFO).
//
// What is counted (checked on torch 2.15, Linux): at::empty on the CPU asks GetCPUAllocator() for
// exactly numel * itemsize bytes (no rounding, no caching: the CPU caching allocator is only used by
// StaticRuntime under an explicit guard, and mimalloc only backs MKL's own buffers on Windows), so live
// bytes are exact tensor-storage bytes. Not counted: pinned host memory (CUDA host allocator), oneDNN /
// MKL scratch buffers, and allocations made before the allocator was installed.
//
// c10's contract holds: a block's context is its data pointer (Allocator::raw_allocate asserts it;
// oneDNN convolutions and bf16/fp16 GEMMs allocate through it); sizes live in a table keyed by the
// pointer. Nested allocators credit every level and allocate from the innermost non-counting one.
//
// Lifetime: a storage remembers its allocator (resize_ allocates through it) and its deleter updates
// the counters, so neither may die before the storage. The counters are shared with every block, and
// an uninstalled allocator is retired (kept alive, limit removed) rather than destroyed.
#pragma once

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "zeroplan/profiles/errors.h"

namespace zeroplan {

// A device-memory limit was hit: the allocation of request_bytes with live_bytes already live needs
// need_bytes = live_bytes + request_bytes > limit_bytes. what() is one line:
// "out of device memory on cpu: need A bytes, limit L (allocating R bytes with V live)".
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(std::string device, std::int64_t request_bytes, std::int64_t live_bytes,
                   std::int64_t limit_bytes);
  const std::string& device() const { return device_; }
  std::int64_t request_bytes() const { return request_bytes_; }
  std::int64_t live_bytes() const { return live_bytes_; }
  std::int64_t need_bytes() const { return live_bytes_ + request_bytes_; }
  std::int64_t limit_bytes() const { return limit_bytes_; }

 private:
  std::string device_;
  std::int64_t request_bytes_;
  std::int64_t live_bytes_;
  std::int64_t limit_bytes_;
};

// Counters shared by an allocator and every block it handed out. All atomic: intra-op threads allocate.
struct AllocationCounters {
  std::atomic<std::int64_t> live_bytes{0};
  std::atomic<std::int64_t> peak_bytes{0};
  std::atomic<std::int64_t> allocations{0};   // number of allocate() calls that succeeded
  std::atomic<std::int64_t> limit_bytes{-1};  // < 0: no limit
  std::shared_ptr<AllocationCounters> parent;  // the enclosing counting allocator's, credited too
};

class CountingAllocator final : public at::Allocator {
 public:
  // Wraps `inner` (not owned; must outlive every allocation). nullptr = c10::GetCPUAllocator().
  explicit CountingAllocator(at::Allocator* inner = nullptr);

  // The DataPtr's context is its data pointer and its deleter raw_deleter(), as c10 requires.
  at::DataPtr allocate(size_t n) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  std::int64_t live_bytes() const { return counters_->live_bytes.load(); }
  std::int64_t peak_bytes() const { return counters_->peak_bytes.load(); }
  std::int64_t allocations() const { return counters_->allocations.load(); }
  // Peak := current live bytes; returns the live bytes (the base of the next phase's peak).
  std::int64_t reset_peak();
  // Refuse allocations that would take live bytes above `limit_bytes` (throws OutOfMemoryError);
  // a negative limit removes it.
  void set_limit(std::int64_t limit_bytes) { counters_->limit_bytes.store(limit_bytes); }
  std::int64_t limit() const { return counters_->limit_bytes.load(); }
  at::Allocator* inner() const { return inner_; }

 private:
  at::Allocator* inner_;
  at::Allocator* root_;  // the innermost allocator that is not a CountingAllocator
  std::shared_ptr<AllocationCounters> counters_;
};

// Installs a CountingAllocator as the CPU allocator for its lifetime; the destructor reinstalls the
// allocator that was current before. REQUIRES: scopes end in reverse order of construction.
class ScopedCpuAllocator {
 public:
  explicit ScopedCpuAllocator(std::int64_t limit_bytes = -1);
  ~ScopedCpuAllocator();
  ScopedCpuAllocator(const ScopedCpuAllocator&) = delete;
  ScopedCpuAllocator& operator=(const ScopedCpuAllocator&) = delete;

  CountingAllocator& allocator() { return *allocator_; }
  const CountingAllocator& allocator() const { return *allocator_; }

  // SetCPUAllocator only replaces an allocator of lower or equal priority; zeroplan uses this one.
  static constexpr std::uint8_t kPriority = 200;

 private:
  at::Allocator* previous_;
  std::unique_ptr<CountingAllocator> allocator_;
};

}  // namespace zeroplan
