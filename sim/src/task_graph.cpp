#include "zeroplan/sim/task_graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>

namespace zeroplan::sim {

std::string_view to_string(MemCategory c) {
  switch (c) {
    case MemCategory::params: return "params";
    case MemCategory::grads: return "grads";
    case MemCategory::optimizer: return "optimizer";
    case MemCategory::activations: return "activations";
    case MemCategory::buffers: return "buffers";
    case MemCategory::overhead: return "overhead";
  }
  return "?";
}

std::string_view to_string(ResourceKind k) {
  switch (k) {
    case ResourceKind::compute: return "compute";
    case ResourceKind::copy_h2d: return "copy_h2d";
    case ResourceKind::copy_d2h: return "copy_d2h";
    case ResourceKind::comm: return "comm";
    case ResourceKind::host_optimizer: return "host_optimizer";
    case ResourceKind::host_memcpy: return "host_memcpy";
    case ResourceKind::other: return "other";
  }
  return "?";
}

namespace {

// The lists (memory only) of the last graph destroyed on this thread, for the next reserve(). The flag
// is trivially destructible, so a graph destroyed after this thread's cache (at its exit) sees it gone.
thread_local bool recycled_gone = false;
struct Recycled {
  std::vector<Task> tasks;
  std::vector<std::pair<TaskId, TaskId>> deps;
  std::vector<Alloc> allocs;
  ~Recycled() { recycled_gone = true; }
};
Recycled* recycled() {
  if (recycled_gone) return nullptr;
  thread_local Recycled r;
  return &r;
}
// A list larger than this is not kept (a huge pipeline's graph would stay held by an idle thread).
constexpr std::size_t kMaxRecycledBytes = std::size_t{64} << 20;

template <class T>
void keep(std::vector<T>& mine, std::vector<T>& cache) {
  if (mine.capacity() <= cache.capacity() || mine.capacity() * sizeof(T) > kMaxRecycledBytes) return;
  mine.clear();
  cache.swap(mine);
}

template <class T>
void take(std::vector<T>& mine, std::vector<T>& cache, std::size_t n) {
  if (!mine.empty() || mine.capacity() >= n || cache.capacity() < n) return;
  cache.clear();
  mine.swap(cache);
}

}  // namespace

TaskGraph::TaskGraph() { names_.emplace_back("task"); }

TaskGraph::~TaskGraph() {
  if (Recycled* r = recycled()) {
    keep(tasks_, r->tasks);
    keep(deps_, r->deps);
    keep(allocs_, r->allocs);
  }
}

NameId TaskGraph::intern(std::string_view name) {
  // Few distinct names (one per kind of task), so a linear scan beats a map and keeps ids in first-use order.
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return static_cast<NameId>(i);
  }
  names_.emplace_back(name);
  return static_cast<NameId>(names_.size() - 1);
}

std::string TaskGraph::label_text(const Label& l) const {
  std::string s(names_[l.name]);
  if (l.unit >= 0) s += fmt::format(" u{}", l.unit);
  if (l.microbatch >= 0) s += fmt::format(" mb{}", l.microbatch);
  return s;
}

GroupId TaskGraph::add_group(std::string name, double capacity) {
  assert(capacity > 0);
  groups_.push_back({std::move(name), capacity});
  return static_cast<GroupId>(groups_.size() - 1);
}

ResourceId TaskGraph::add_resource(std::string name, ResourceKind kind, GroupId group, double contended_rate) {
  assert(group == kNone || group < groups_.size());
  assert(contended_rate >= 0 && contended_rate <= 1);
  resources_.push_back({std::move(name), kind, group, contended_rate});
  return static_cast<ResourceId>(resources_.size() - 1);
}

void TaskGraph::set_skew(ResourceId resource, ResourceId source, double fraction) {
  assert(resource < resources_.size() && source < resources_.size());
  assert(fraction >= 0 && fraction <= 1);
  resources_[resource].skew_fraction = fraction;
  resources_[resource].skew_source = source;
}

PoolId TaskGraph::add_pool(std::string name, std::int64_t capacity_bytes, bool pinned_pow2) {
  pools_.push_back({std::move(name), capacity_bytes, pinned_pow2});
  return static_cast<PoolId>(pools_.size() - 1);
}

AllocId TaskGraph::resident(PoolId pool, std::int64_t bytes, MemCategory cat, Label label, TaskId free_at) {
  assert(pool < pools_.size() && bytes >= 0);
  assert(free_at == kNone || free_at < tasks_.size());
  allocs_.push_back({pool, cat, label, bytes, kNone, free_at});
  return static_cast<AllocId>(allocs_.size() - 1);
}

void TaskGraph::reserve(std::size_t tasks, std::size_t deps, std::size_t allocs) {
  if (Recycled* r = recycled()) {
    take(tasks_, r->tasks, tasks);
    take(deps_, r->deps, deps);
    take(allocs_, r->allocs, allocs);
  }
  tasks_.reserve(tasks);
  deps_.reserve(deps);
  allocs_.reserve(allocs);
}

}  // namespace zeroplan::sim
