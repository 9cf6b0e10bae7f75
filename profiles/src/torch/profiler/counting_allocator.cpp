#include "zeroplan/profiles/counting_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <mutex>
#include <utility>
#include <vector>

namespace zeroplan {

OutOfMemoryError::OutOfMemoryError(std::string device, std::int64_t request_bytes,
                                   std::int64_t live_bytes, std::int64_t limit_bytes)
    : std::runtime_error("out of device memory on " + device + ": need " +
                         std::to_string(live_bytes + request_bytes) + " bytes, limit " +
                         std::to_string(limit_bytes) + " (allocating " +
                         std::to_string(request_bytes) + " bytes with " +
                         std::to_string(live_bytes) + " live)"),
      device_(std::move(device)),
      request_bytes_(request_bytes),
      live_bytes_(live_bytes),
      limit_bytes_(limit_bytes) {}

namespace {

// The context of every block handed out: the inner allocation, its size, and the counters to debit.
struct Block {
  at::DataPtr inner;
  std::int64_t bytes;
  std::shared_ptr<AllocationCounters> counters;
};

void delete_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  block->counters->live_bytes.fetch_sub(block->bytes);
  delete block;  // frees the inner DataPtr through its own deleter
}

void raise_peak(AllocationCounters& c, std::int64_t live) {
  std::int64_t peak = c.peak_bytes.load();
  while (live > peak && !c.peak_bytes.compare_exchange_weak(peak, live)) {
  }
}

}  // namespace

CountingAllocator::CountingAllocator(at::Allocator* inner)
    : inner_(inner != nullptr ? inner : c10::GetCPUAllocator()),
      counters_(std::make_shared<AllocationCounters>()) {}

at::DataPtr CountingAllocator::allocate(size_t n) {
  const auto bytes = static_cast<std::int64_t>(n);
  const std::int64_t live = counters_->live_bytes.fetch_add(bytes) + bytes;
  const std::int64_t limit = counters_->limit_bytes.load();
  if (limit >= 0 && live > limit) {
    counters_->live_bytes.fetch_sub(bytes);
    throw OutOfMemoryError("cpu", bytes, live - bytes, limit);
  }
  at::DataPtr inner;
  try {
    inner = inner_->allocate(n);
  } catch (...) {
    counters_->live_bytes.fetch_sub(bytes);
    throw;
  }
  raise_peak(*counters_, live);
  counters_->allocations.fetch_add(1);
  void* data = inner.get();
  const at::Device device = inner.device();
  auto* block = new Block{std::move(inner), bytes, counters_};
  return at::DataPtr(data, block, &delete_block, device);
}

void CountingAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}

std::int64_t CountingAllocator::reset_peak() {
  const std::int64_t live = counters_->live_bytes.load();
  counters_->peak_bytes.store(live);
  return live;
}

namespace {
std::mutex g_retired_mutex;
std::vector<std::unique_ptr<CountingAllocator>>& retired() {
  static auto* list = new std::vector<std::unique_ptr<CountingAllocator>>();  // never destroyed
  return *list;
}
}  // namespace

ScopedCpuAllocator::ScopedCpuAllocator(std::int64_t limit_bytes)
    : previous_(c10::GetCPUAllocator()),
      allocator_(std::make_unique<CountingAllocator>(previous_)) {
  allocator_->set_limit(limit_bytes);
  c10::SetCPUAllocator(allocator_.get(), kPriority);
  TORCH_INTERNAL_ASSERT(c10::GetCPUAllocator() == allocator_.get(),
                        "a CPU allocator of priority above ", int(kPriority), " is installed");
}

ScopedCpuAllocator::~ScopedCpuAllocator() {
  TORCH_INTERNAL_ASSERT(c10::GetCPUAllocator() == allocator_.get(),
                        "ScopedCpuAllocator scopes must end in reverse order");
  c10::SetCPUAllocator(previous_, kPriority);
  allocator_->set_limit(-1);
  std::lock_guard<std::mutex> lock(g_retired_mutex);
  retired().push_back(std::move(allocator_));
}

}  // namespace zeroplan
