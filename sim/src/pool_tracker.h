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
    std::vector<std::uint32_t> log;
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
  void allocate(AllocId a, double now);
  void free(AllocId a, double now);
  void point(PoolId p, double now, std::int64_t bytes);  // the pool's timeline after a change at now
  [[noreturn]] void freed_early(AllocId a) const;        // throws SimError naming the allocation

  const TaskGraph& g_;
  const Alloc* allocs_;         // g_.allocs()
  std::vector<char> pinned_;    // per pool: pinned_pow2
  Csr& by_owner_;
  Csr& by_free_;
  std::vector<State>& state_;
  std::vector<std::uint32_t>& log_;  // alloc id, high bit set for a free
  std::vector<char>& live_;
  std::vector<AllocId>& resident_;
  std::vector<std::int64_t> current_;
  std::vector<std::int64_t> peak_;
  std::vector<double> peak_time_;
  std::vector<std::size_t> peak_log_end_;
  // pinned_pow2 pools: per pool and power of two, blocks live now and the most ever live at once.
  std::vector<std::array<std::int64_t, 64>> live_blocks_, most_blocks_;
  std::vector<std::vector<std::pair<double, std::int64_t>>>& timeline_;  // per pool: (time, bytes) after each change
};

}  // namespace zeroplan::sim::detail
