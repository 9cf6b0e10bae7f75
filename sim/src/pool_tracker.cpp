#include "pool_tracker.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "zeroplan/profiles/host_allocator.h"
#include "zeroplan/sim/errors.h"

namespace zeroplan::sim::detail {

PoolTracker::PoolTracker(const TaskGraph& g, Buffers& buffers)
    : g_(g),
      allocs_(g.allocs().data()),
      by_owner_(buffers.by_owner),
      by_free_(buffers.by_free),
      state_(buffers.state),
      log_(buffers.log),
      live_(buffers.live),
      resident_(buffers.resident),
      timeline_(buffers.timeline) {
  const auto& allocs = g.allocs();
  const auto n_tasks = static_cast<std::uint32_t>(g.num_tasks());
  const auto n_allocs = static_cast<std::uint32_t>(allocs.size());
  const std::size_t pools = g.pools().size();
  // Both lists and each pool's count of allocations in one pass over the allocations, then one to place.
  std::vector<std::size_t> changes(pools, 1);  // timeline points: at most one per allocation and free, and the first
  by_owner_.begin_count(n_tasks);
  by_free_.begin_count(n_tasks);
  resident_.clear();
  for (const Alloc& a : allocs) {
    if (a.owner != kNone) by_owner_.count_one(a.owner);
    else resident_.push_back(static_cast<AllocId>(&a - allocs.data()));
    if (a.free_at != kNone) by_free_.count_one(a.free_at);
    changes[a.pool] += 2;
  }
  by_owner_.begin_place();
  by_free_.begin_place();
  for (std::uint32_t i = 0; i < n_allocs; ++i) {
    if (allocs[i].owner != kNone) by_owner_.place(allocs[i].owner, i);
    if (allocs[i].free_at != kNone) by_free_.place(allocs[i].free_at, i);
  }
  by_owner_.end_place();
  by_free_.end_place();
  state_.assign(n_allocs, State::pending);
  current_.assign(pools, 0);
  peak_.assign(pools, 0);
  peak_time_.assign(pools, 0);
  peak_log_end_.assign(pools, 0);
  // Kept between runs: the lists are cleared, their memory stays (a list reserved for the most points a
  // pool can have is mostly untouched, and was faulted in again at every run when handed back).
  if (timeline_.size() < pools) timeline_.resize(pools);
  if (log_.size() < pools) log_.resize(pools);
  live_blocks_.assign(pools, {});
  most_blocks_.assign(pools, {});
  for (std::size_t p = 0; p < pools; ++p) {
    timeline_[p].clear();
    timeline_[p].reserve(changes[p]);
    timeline_[p].emplace_back(0.0, 0);
    log_[p].clear();
    log_[p].reserve(changes[p] - 1);
  }
  pinned_.resize(pools);
  for (std::size_t p = 0; p < pools; ++p) pinned_[p] = g.pools()[p].pinned_pow2 ? 1 : 0;
}

void PoolTracker::allocate_block(PoolId p, std::int64_t bytes) {
  const auto k = static_cast<std::size_t>(pinned_block_class(bytes));
  most_blocks_[p][k] = std::max(most_blocks_[p][k], ++live_blocks_[p][k]);
}

void PoolTracker::free_block(PoolId p, std::int64_t bytes) {
  --live_blocks_[p][static_cast<std::size_t>(pinned_block_class(bytes))];
}

void PoolTracker::freed_early(AllocId a) const {
  const Alloc& al = allocs_[a];
  const std::string owner = al.owner == kNone ? "t=0" : fmt::format("\"{}\"", g_.task_name(al.owner));
  throw SimError(fmt::format("simulate: memory \"{}\" on pool \"{}\" is freed by \"{}\" before {} allocates it",
                             g_.label_text(al.label), g_.pools()[al.pool].name, g_.task_name(al.free_at), owner));
}

void PoolTracker::start_resident() {
  for (const AllocId a : resident_) allocate(a, 0.0);
}

std::vector<PoolResult> PoolTracker::results() {
  const auto& allocs = g_.allocs();
  std::vector<PoolResult> out(g_.pools().size());
  std::vector<char>& live = live_;
  live.assign(allocs.size(), 0);
  // (category, name) -> (bytes, count), a flat table read in (category, name) order.
  const std::size_t names = g_.num_names();
  std::vector<std::pair<std::int64_t, std::int32_t>> groups(kNumMemCategories * names);
  for (PoolId p = 0; p < out.size(); ++p) {
    PoolResult& r = out[p];
    r.name = g_.pools()[p].name;
    r.peak_bytes = peak_[p];
    r.peak_time_s = peak_time_[p];
    r.end_bytes = current_[p];
    r.reserved_bytes = r.peak_bytes;
    if (g_.pools()[p].pinned_pow2) {
      r.reserved_bytes = 0;
      for (std::size_t k = 0; k < most_blocks_[p].size(); ++k) r.reserved_bytes += most_blocks_[p][k] << k;
    }
    r.timeline.assign(timeline_[p].begin(), timeline_[p].end());
    // What was live at the peak: the pool's log replayed up to it; each live allocation counted once.
    const std::vector<std::uint32_t>& log = log_[p];
    const std::size_t end = peak_log_end_[p];
    for (std::size_t i = 0; i < end; ++i) live[log[i] & ~kFreeBit] = (log[i] & kFreeBit) == 0;
    std::fill(groups.begin(), groups.end(), std::pair<std::int64_t, std::int32_t>{0, 0});
    for (std::size_t i = 0; i < end; ++i) {
      const std::uint32_t a = log[i];  // an allocation (no free bit) still live: counted, then cleared
      if ((a & kFreeBit) != 0 || !live[a]) continue;
      live[a] = 0;
      const auto cat = static_cast<std::size_t>(allocs[a].category);
      auto& e = groups[cat * names + allocs[a].label.name];
      e.first += allocs[a].bytes;
      e.second += 1;
      r.peak_by_category[cat] += allocs[a].bytes;
    }
    for (std::size_t k = 0; k < groups.size(); ++k) {
      if (groups[k].second == 0) continue;
      r.resident_at_peak.push_back({static_cast<MemCategory>(k / names), std::string(g_.name(static_cast<NameId>(k % names))),
                                    groups[k].first, groups[k].second});
    }
    std::stable_sort(r.resident_at_peak.begin(), r.resident_at_peak.end(), [](const auto& a, const auto& b) {
      return std::tie(a.category, b.bytes, a.name) < std::tie(b.category, a.bytes, b.name);
    });
  }
  return out;
}

}  // namespace zeroplan::sim::detail
