// The task graph of one simulated step: resources (streams), shared-bandwidth groups, memory pools,
// tasks with dependencies and memory effects. Built by lowering, run by sim::run (engine.h).
// Everything is a flat vector indexed by a 32-bit id; names are interned once.
#pragma once

#include <array>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zeroplan::sim {

using TaskId = std::uint32_t;
using ResourceId = std::uint32_t;
using GroupId = std::uint32_t;
using PoolId = std::uint32_t;
using NameId = std::uint32_t;
using AllocId = std::uint32_t;
inline constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

// What a byte of memory is for; --explain groups the peak by these.
enum class MemCategory : std::uint8_t { params, grads, optimizer, activations, buffers, overhead };
inline constexpr int kNumMemCategories = 6;
std::string_view to_string(MemCategory c);

enum class ResourceKind : std::uint8_t { compute, copy_h2d, copy_d2h, comm, host_optimizer, host_memcpy, other };
std::string_view to_string(ResourceKind k);

// A task's or an allocation's display name: "<name>", "<name> u<unit>", "<name> u<unit> mb<mb>".
struct Label {
  NameId name = 0;
  std::int32_t unit = -1;
  std::int32_t microbatch = -1;
};

// A resource runs its tasks one at a time in the order they were added (a CUDA stream, a channel).
struct Resource {
  std::string name;
  ResourceKind kind = ResourceKind::other;
  GroupId group = kNone;  // shared-bandwidth group, or kNone
  // In a group: the rate of its tasks while one other member of the group runs too (a measured
  // slowdown, CPU cores shared by compute and collectives; more members slow it more, below); 0: the
  // group's equal share.
  double contended_rate = 0;
  // Rank skew (collectives on ranks that drift apart): a task here starts its work only once every rank
  // has issued it, `skew_fraction` x the seconds `skew_source` (this rank's compute) has been busy since
  // the ranks were last aligned after its ready time; it holds the resource meanwhile (a collective
  // waiting for the last rank) but not its group's cores. The ranks are aligned at the step's start and
  // whenever one of these tasks completes while the source is idle (the rank waited for it, as every
  // rank did). 0: none.
  double skew_fraction = 0;
  ResourceId skew_source = kNone;
};

// Contention model (a progress-rate model as in SimGrid's constant-share network): the running tasks of
// all resources in a group split `capacity` equally, each progressing at rate min(1, capacity / n) of its
// stand-alone speed, where n is how many run in the group now, unless the resource has a contended_rate
// r, measured beside one other member: then 1 / (1 + (n - 1)(1 / r - 1)), each other member adding the
// same slowdown (r itself when n = 2). Rates change only at events, so the model is exact and
// deterministic.
// capacity 1: two concurrent copies on one PCIe link each take twice as long; capacity 2: two run at full
// speed, a third slows all three to 2/3.
struct SharedGroup {
  std::string name;
  double capacity = 1.0;
};

struct Pool {
  std::string name;
  std::int64_t capacity_bytes = 0;  // informational (0: unknown); the engine never refuses an allocation
  // Pinned host memory from a caching allocator (zeroplan/profiles/host_allocator.h): every allocation
  // takes a block of the next power of two, a freed block waits for a request of the same power of two.
  bool pinned_pow2 = false;
};

struct Task {
  Label label;
  ResourceId resource = 0;
  double duration_s = 0;  // stand-alone time; longer under contention
  NameId category = 0;    // trace "cat"
};

// `bytes` on `pool` are allocated when `owner` starts (owner kNone: resident from t = 0) and freed when
// `free_at` ends (free_at == owner: at the owner's end; kNone: never, resident to the end of the step).
struct Alloc {
  PoolId pool = 0;
  MemCategory category = MemCategory::buffers;
  Label label;
  std::int64_t bytes = 0;
  TaskId owner = kNone;
  TaskId free_at = kNone;
};

class TaskGraph {
 public:
  TaskGraph();
  TaskGraph(const TaskGraph&) = default;
  TaskGraph(TaskGraph&&) noexcept = default;
  TaskGraph& operator=(const TaskGraph&) = default;
  TaskGraph& operator=(TaskGraph&&) noexcept = default;
  // Hands its task, dependency and allocation lists to the next reserve() on this thread (their memory,
  // not their contents): a thread lowering plan after plan reuses one graph's memory instead of having it
  // handed back to the system and faulted in again (a fifth of a GPT-3 lowering's time).
  ~TaskGraph();

  NameId intern(std::string_view name);
  std::string_view name(NameId id) const { return names_[id]; }
  std::size_t num_names() const { return names_.size(); }
  std::string label_text(const Label& l) const;

  GroupId add_group(std::string name, double capacity);
  // REQUIRES: contended_rate in [0, 1] (0: the group's equal share).
  ResourceId add_resource(std::string name, ResourceKind kind, GroupId group = kNone, double contended_rate = 0);
  PoolId add_pool(std::string name, std::int64_t capacity_bytes = 0, bool pinned_pow2 = false);
  // REQUIRES: both resources exist, fraction in [0, 1].
  void set_skew(ResourceId resource, ResourceId source, double fraction);

  // REQUIRES: resource exists, duration_s >= 0 and finite, every dep exists.
  TaskId add_task(ResourceId resource, double duration_s, Label label, std::initializer_list<TaskId> deps = {},
                  NameId category = 0) {
    assert(resource < resources_.size());
    assert(duration_s >= 0 && std::isfinite(duration_s));
    tasks_.push_back({label, resource, duration_s, category});
    const auto id = static_cast<TaskId>(tasks_.size() - 1);
    for (TaskId d : deps) add_dep(id, d);
    return id;
  }
  // `task` cannot start before `depends_on` has finished. kNone is ignored, so optional deps read simply.
  void add_dep(TaskId task, TaskId depends_on) {
    if (depends_on == kNone) return;
    assert(task < tasks_.size() && depends_on < tasks_.size());
    deps_.emplace_back(task, depends_on);
  }

  // Allocate at the start of `owner`, free at the end of `free_at` (default: owner's own end).
  AllocId alloc(TaskId owner, PoolId pool, std::int64_t bytes, MemCategory cat, Label label) {
    return alloc(owner, pool, bytes, cat, label, owner);
  }
  AllocId alloc(TaskId owner, PoolId pool, std::int64_t bytes, MemCategory cat, Label label, TaskId free_at) {
    assert(owner < tasks_.size() && pool < pools_.size() && bytes >= 0);
    assert(free_at == kNone || free_at < tasks_.size());
    allocs_.push_back({pool, cat, label, bytes, owner, free_at});
    return static_cast<AllocId>(allocs_.size() - 1);
  }
  // Resident from t = 0; freed at the end of `free_at` (kNone: never).
  AllocId resident(PoolId pool, std::int64_t bytes, MemCategory cat, Label label, TaskId free_at = kNone);
  void set_free_at(AllocId a, TaskId free_at) {
    assert(a < allocs_.size() && (free_at == kNone || free_at < tasks_.size()));
    allocs_[a].free_at = free_at;
  }

  // Room for that many of each (taking the lists a graph destroyed on this thread left, when large enough).
  void reserve(std::size_t tasks, std::size_t deps, std::size_t allocs);

  std::size_t num_tasks() const { return tasks_.size(); }
  const std::vector<Task>& tasks() const { return tasks_; }
  const std::vector<std::pair<TaskId, TaskId>>& deps() const { return deps_; }  // (task, depends_on)
  const std::vector<Resource>& resources() const { return resources_; }
  const std::vector<SharedGroup>& groups() const { return groups_; }
  const std::vector<Pool>& pools() const { return pools_; }
  const std::vector<Alloc>& allocs() const { return allocs_; }
  std::string task_name(TaskId t) const { return label_text(tasks_[t].label); }

 private:
  std::vector<std::string> names_;
  std::vector<Resource> resources_;
  std::vector<SharedGroup> groups_;
  std::vector<Pool> pools_;
  std::vector<Task> tasks_;
  std::vector<std::pair<TaskId, TaskId>> deps_;
  std::vector<Alloc> allocs_;
};

}  // namespace zeroplan::sim
