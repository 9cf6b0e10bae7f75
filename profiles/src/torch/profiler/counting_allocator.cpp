#include "zeroplan/profiles/counting_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace zeroplan {

OutOfMemoryError::OutOfMemoryError(std::string device, std::int64_t request_bytes,
                                   std::int64_t live_bytes, std::int64_t limit_bytes)
    : Error(ErrorKind::run_failed, "out of device memory on " + device + ": need " +
                         std::to_string(live_bytes + request_bytes) + " bytes, limit " +
                         std::to_string(limit_bytes) + " (allocating " +
                         std::to_string(request_bytes) + " bytes with " +
                         std::to_string(live_bytes) + " live)"),
      device_(std::move(device)),
      request_bytes_(request_bytes),
      live_bytes_(live_bytes),
      limit_bytes_(limit_bytes) {}

namespace {

// c10's contract (Allocator::raw_allocate asserts it; oneDNN convolutions and reduced-precision GEMMs
// allocate through it): a DataPtr's context IS its data pointer and its deleter a plain function of
// that pointer. So the size of every block, the counters to debit and the root allocator's deleter are
// kept in a table keyed by the data pointer, sharded to keep intra-op threads off one lock.
struct Entry {
  std::int64_t bytes;
  std::shared_ptr<AllocationCounters> counters;  // debited along the parent chain
  c10::DeleterFnPtr root_deleter;
};

class BlockTable {
 public:
  void insert(void* p, Entry e) {
    Shard& s = shard(p);
    std::lock_guard<std::mutex> lock(s.mutex);
    s.entries.emplace(p, std::move(e));
  }
  Entry take(void* p) {
    Shard& s = shard(p);
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.entries.find(p);
    TORCH_INTERNAL_ASSERT(it != s.entries.end(), "counting allocator: freeing an unknown block");
    Entry e = std::move(it->second);
    s.entries.erase(it);
    return e;
  }

 private:
  struct Shard {
    std::mutex mutex;
    std::unordered_map<void*, Entry> entries;
  };
  static constexpr std::size_t kShards = 16;
  Shard& shard(void* p) { return shards_[(reinterpret_cast<std::uintptr_t>(p) >> 6) % kShards]; }
  std::array<Shard, kShards> shards_;
};

BlockTable& table() {
  static auto* t = new BlockTable();  // never destroyed: storages may outlive static destruction
  return *t;
}

void raise_peak(AllocationCounters& c, std::int64_t live) {
  std::int64_t peak = c.peak_bytes.load();
  while (live > peak && !c.peak_bytes.compare_exchange_weak(peak, live)) {
  }
}

void debit(AllocationCounters* c, std::int64_t bytes) {
  for (; c != nullptr; c = c->parent.get()) c->live_bytes.fetch_sub(bytes);
}

void delete_block(void* p) {
  if (p == nullptr) return;
  Entry e = table().take(p);
  debit(e.counters.get(), e.bytes);
  e.root_deleter(p);
}

}  // namespace

CountingAllocator::CountingAllocator(at::Allocator* inner)
    : inner_(inner != nullptr ? inner : c10::GetCPUAllocator()),
      counters_(std::make_shared<AllocationCounters>()) {
  // Nested counting: allocate from the innermost non-counting allocator and credit every level.
  if (auto* counting = dynamic_cast<CountingAllocator*>(inner_)) {
    counters_->parent = counting->counters_;
    root_ = counting->root_;
  } else {
    root_ = inner_;
  }
}

at::DataPtr CountingAllocator::allocate(size_t n) {
  const auto bytes = static_cast<std::int64_t>(n);
  // Credit every level first (so concurrent allocations see each other), then check the limits.
  AllocationCounters* failed = nullptr;
  std::int64_t failed_live = 0;
  for (AllocationCounters* c = counters_.get(); c != nullptr; c = c->parent.get()) {
    const std::int64_t live = c->live_bytes.fetch_add(bytes) + bytes;
    const std::int64_t limit = c->limit_bytes.load();
    if (failed == nullptr && limit >= 0 && live > limit) {
      failed = c;
      failed_live = live - bytes;
    }
  }
  if (failed != nullptr) {
    debit(counters_.get(), bytes);
    throw OutOfMemoryError("cpu", bytes, failed_live, failed->limit_bytes.load());
  }
  at::DataPtr inner;
  try {
    inner = root_->allocate(n);
  } catch (...) {
    debit(counters_.get(), bytes);
    throw;
  }
  void* data = inner.get();
  const at::Device device = inner.device();
  if (data == nullptr) {  // zero-byte blocks: nothing to free, nothing to track
    debit(counters_.get(), bytes);
    return at::DataPtr(nullptr, nullptr, &delete_block, device);
  }
  TORCH_INTERNAL_ASSERT(inner.get_context() == data,
                        "counting allocator: the wrapped CPU allocator's context is not its data");
  const c10::DeleterFnPtr root_deleter = inner.get_deleter();
  inner.release_context();  // ownership passes to the table entry
  for (AllocationCounters* c = counters_.get(); c != nullptr; c = c->parent.get()) {
    raise_peak(*c, c->live_bytes.load());
    c->allocations.fetch_add(1);
  }
  table().insert(data, Entry{bytes, counters_, root_deleter});
  return at::DataPtr(data, data, &delete_block, device);
}

c10::DeleterFnPtr CountingAllocator::raw_deleter() const { return &delete_block; }

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
// Every scope's allocator and the one it replaced, and whether it ended (under g_retired_mutex).
struct ScopeRecord {
  const at::Allocator* allocator;
  at::Allocator* previous;
  bool ended;
};
std::vector<ScopeRecord>& scope_records() {
  static auto* list = new std::vector<ScopeRecord>();  // never destroyed
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
  std::lock_guard<std::mutex> lock(g_retired_mutex);
  scope_records().push_back({allocator_.get(), previous_, false});
}

// Scopes normally end in reverse order. One that ends while a later one is still installed (two
// zeroplan.wrap engines, the first collected after the second was made) is marked ended; the later one,
// when it ends, puts back the newest allocator whose scope is still open, so no ended scope stays installed
// and none is reinstalled.
ScopedCpuAllocator::~ScopedCpuAllocator() {
  std::lock_guard<std::mutex> lock(g_retired_mutex);
  auto& records = scope_records();
  auto find = [&](const at::Allocator* a) -> ScopeRecord* {
    for (auto& r : records)
      if (r.allocator == a) return &r;
    return nullptr;
  };
  if (ScopeRecord* mine = find(allocator_.get()); mine != nullptr) mine->ended = true;
  if (c10::GetCPUAllocator() == allocator_.get()) {
    at::Allocator* restore = previous_;
    for (ScopeRecord* r = find(restore); r != nullptr && r->ended; r = find(restore)) restore = r->previous;
    c10::SetCPUAllocator(restore, kPriority);
  }
  while (!records.empty() && records.back().ended) records.pop_back();  // nested use keeps the list short
  allocator_->set_limit(-1);
  retired().push_back(std::move(allocator_));
}

}  // namespace zeroplan
