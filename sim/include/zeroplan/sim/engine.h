// The discrete-event engine: runs a TaskGraph and reports when every task ran and what every pool held.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "zeroplan/sim/errors.h"
#include "zeroplan/sim/task_graph.h"

namespace zeroplan::sim {

// One line of "what was resident at the peak": allocations grouped by category and name.
struct ResidentItem {
  MemCategory category = MemCategory::buffers;
  std::string name;  // the allocation's label name without unit and microbatch
  std::int64_t bytes = 0;
  std::int32_t count = 0;  // how many allocations were summed
};

struct PoolResult {
  std::string name;
  std::int64_t peak_bytes = 0;
  double peak_time_s = 0;
  std::int64_t end_bytes = 0;
  // What the allocator holds at the end: peak_bytes, or for a pinned_pow2 pool the sum over powers of
  // two of the most blocks of that size live at once times the size (>= peak_bytes).
  std::int64_t reserved_bytes = 0;
  std::array<std::int64_t, kNumMemCategories> peak_by_category{};  // sums to peak_bytes
  std::vector<ResidentItem> resident_at_peak;  // sorted by category, then bytes descending, then name
  std::vector<std::pair<double, std::int64_t>> timeline;  // (time, bytes) after each change; one point per instant
};

struct ResourceResult {
  std::string name;
  double busy_s = 0;   // wall time with a task running
  double work_s = 0;   // sum of stand-alone durations
  std::uint32_t tasks = 0;
};

struct SimResult {
  double makespan_s = 0;
  std::vector<double> start_s;  // per task
  std::vector<double> end_s;    // per task
  std::vector<ResourceResult> resources;
  std::vector<PoolResult> pools;
  std::uint64_t events = 0;     // clock advances
  // graph.h's longest_chain_s of the graph, found beside the run when every dependency is an earlier task
  // (the lowering's graphs); -1 otherwise.
  double longest_chain_s = -1;
};

// Runs every task to completion. Deterministic: ties fire in resource-id order, frees before allocations
// at one instant. Throws CycleError when the dependencies have a cycle and DeadlockError when some task
// can never start (naming it). Does not check acyclicity itself unless `check_cycles`.
SimResult run(const TaskGraph& graph, bool check_cycles = true);

}  // namespace zeroplan::sim
