// Memory accounting for the engine: applies each task's allocations and frees, keeps every pool's
// timeline and peak, and reconstructs what was resident at the peak by replaying the log.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "csr.h"
#include "zeroplan/sim/engine.h"
#include "zeroplan/sim/task_graph.h"

namespace zeroplan::sim::detail {

class PoolTracker {
 public:
  enum class State : std::uint8_t { pending, live, freed };
  // Per-run working memory a caller may keep between runs (the engine keeps one per thread).
  struct Buffers {
    Csr by_owner;  // per task, the allocations it makes
    Csr by_free;   // per task, the allocations freed at its end
    std::vector<State> state;
    std::vector<std::vector<std::uint32_t>> log;  // per pool
    std::vector<char> live;
    std::vector<AllocId> resident;  // allocations without an owner, in id order
    std::vector<std::vector<std::pair<double, std::int64_t>>> timeline;  // per pool
  };
  PoolTracker(const TaskGraph& g, Buffers& buffers);
  void start_resident();                 // allocations resident from t = 0
  void on_start(TaskId t, double now) {  // allocations owned by t
    for (std::uint32_t a : by_owner_.row(t)) allocate(a, now);
  }
  void on_end(TaskId t, double now) {  // allocations freed at t's end
    for (std::uint32_t a : by_free_.row(t)) free(a, now);
  }
  std::vector<PoolResult> results();  // once, at the end

 private:
  static constexpr std::uint32_t kFreeBit = 0x80000000u;  // in the log: a free

  // Inline: the engine calls these for every allocation and free.
  void allocate(AllocId a, double now) {
    const Alloc& al = allocs_[a];
    const PoolId p = al.pool;
    if (pinned_[p] && al.bytes > 0) allocate_block(p, al.bytes);
    state_[a] = State::live;
    const std::int64_t current = current_[p] += al.bytes;
    std::vector<std::uint32_t>& log = log_[p];
    log.push_back(a);
    if (current > peak_[p]) {
      peak_[p] = current;
      peak_time_[p] = now;
      peak_log_end_[p] = log.size();
    }
    point(p, now, current);
  }
  void free(AllocId a, double now) {
    const Alloc& al = allocs_[a];
    const PoolId p = al.pool;
    if (state_[a] != State::live) freed_early(a);
    if (pinned_[p] && al.bytes > 0) free_block(p, al.bytes);
    state_[a] = State::freed;
    const std::int64_t current = current_[p] -= al.bytes;
    log_[p].push_back(a | kFreeBit);
    point(p, now, current);
  }
  // The pool's timeline after a change at now.
  void point(PoolId p, double now, std::int64_t bytes) {
    auto& tl = timeline_[p];
    if (tl.back().first == now) {
      tl.back().second = bytes;
    } else {
      tl.emplace_back(now, bytes);
    }
  }
  void allocate_block(PoolId p, std::int64_t bytes);  // pinned_pow2 pools' block counts
  void free_block(PoolId p, std::int64_t bytes);
  [[noreturn]] void freed_early(AllocId a) const;  // throws SimError naming the allocation

  const TaskGraph& g_;
  const Alloc* allocs_;         // g_.allocs()
  std::vector<char> pinned_;    // per pool: pinned_pow2
  Csr& by_owner_;
  Csr& by_free_;
  std::vector<State>& state_;
  std::vector<std::vector<std::uint32_t>>& log_;  // per pool: alloc id, kFreeBit set for a free
  std::vector<char>& live_;
  std::vector<AllocId>& resident_;
  std::vector<std::int64_t> current_;
  std::vector<std::int64_t> peak_;
  std::vector<double> peak_time_;
  std::vector<std::size_t> peak_log_end_;  // per pool: its log's length at its peak
  // pinned_pow2 pools: per pool and power of two, blocks live now and the most ever live at once.
  std::vector<std::array<std::int64_t, 64>> live_blocks_, most_blocks_;
  std::vector<std::vector<std::pair<double, std::int64_t>>>& timeline_;  // per pool: (time, bytes) after each change
};

}  // namespace zeroplan::sim::detail
