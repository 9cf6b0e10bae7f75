// The event loop, SimGrid style: start what can start, find the next completion, move the clock there,
// fire the completions in resource order, repeat. Resources run their tasks in the order they were added.
#include "zeroplan/sim/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <limits>

#include "csr.h"
#include "pool_tracker.h"
#include "zeroplan/sim/graph.h"

namespace zeroplan::sim {

namespace {

struct Running {
  TaskId task = kNone;
  double rate = 1;       // fraction of stand-alone speed
  double remaining = 0;  // stand-alone seconds of work left at `last`
  double last = 0;
  double finish = 0;
  double work_from = 0;  // rank skew: no progress (and not in its group) before this time
  bool in_group = false;
};

// `head`: per resource, its next task (kNone: none left).
[[noreturn]] void report_deadlock(const TaskGraph& g, const std::vector<TaskId>& head, const std::vector<double>& end,
                                  double now) {
  const auto& res = g.resources();
  for (ResourceId r = 0; r < res.size(); ++r) {
    if (head[r] == kNone) continue;
    const TaskId t = head[r];
    for (const auto& [task, dep] : g.deps()) {
      if (task != t || end[dep] >= 0) continue;
      const ResourceId dr = g.tasks()[dep].resource;
      const TaskId blocker = head[dr];
      const std::string where = blocker == dep ? fmt::format("next on \"{}\" and itself waiting", res[dr].name)
                                               : fmt::format("queued on \"{}\" behind \"{}\"", res[dr].name,
                                                             g.task_name(blocker));
      throw DeadlockError(fmt::format("simulate: deadlock at t={:.6f} s: task \"{}\" on \"{}\" can never start: it "
                                      "waits for \"{}\", {}",
                                      now, g.task_name(t), res[r].name, g.task_name(dep), where));
    }
  }
  assert(false && "deadlock without a blocked head");
  throw DeadlockError("simulate: deadlock");
}

// The working memory of a run, kept per thread between runs: the tuner simulates thousands of plans on
// each thread, and memory handed back to the system and faulted in again cost more than the lists built in
// it (a fifth of a GPT-3 step's simulation).
struct Workspace {
  std::vector<TaskId> next_on_resource;  // per task, the next task queued on its resource (kNone: last)
  detail::Csr succ;
  std::vector<ResourceId> succ_resource;
  std::vector<std::uint32_t> pending;
  std::vector<double> chain_start;  // per task, the longest chain of its dependencies
  detail::PoolTracker::Buffers memory;
};

// One run of the event loop over a graph: the state the steps share, and the steps as member functions.
class EventLoop {
 public:
  EventLoop(const TaskGraph& g, Workspace& w)
      : g_(g),
        tasks_(g.tasks()),
        n_(static_cast<std::uint32_t>(g.tasks().size())),
        n_res_(static_cast<std::uint32_t>(g.resources().size())),
        n_groups_(static_cast<std::uint32_t>(g.groups().size())),
        next_on_resource_(w.next_on_resource),
        succ_(w.succ),
        succ_resource_(w.succ_resource),
        members_(detail::Csr::build(n_groups_, n_res_, [&](std::uint32_t r) { return g.resources()[r].group; },
                                    [](std::uint32_t r) { return r; }, kNone)),
        pending_(w.pending),
        chain_start_(w.chain_start),
        mem_(g, w.memory),
        first_task_(n_res_, kNone),
        next_task_(n_res_, kNone),
        run_(n_res_),
        group_count_(n_groups_, 0),
        group_dirty_(n_groups_, 0),
        since_aligned_(n_res_, 0.0),
        skew_source_(n_res_, 0),
        next_(n_res_, kNever),
        maybe_ready_((n_res_ + 63) / 64, 0) {
    // Each resource's queue as links from task to task, in the order added.
    next_on_resource_.resize(n_);
    for (TaskId t = 0; t < n_; ++t) {
      const ResourceId r = tasks_[t].resource;
      if (next_task_[r] == kNone) first_task_[r] = t;
      else next_on_resource_[next_task_[r]] = t;
      next_task_[r] = t;
    }
    for (ResourceId r = 0; r < n_res_; ++r) {
      if (next_task_[r] != kNone) next_on_resource_[next_task_[r]] = kNone;
      next_task_[r] = first_task_[r];
    }
    // Successors and unfinished dependencies counted in one pass over the dependencies.
    pending_.assign(n_, 0);
    succ_.begin_count(n_);
    bool in_id_order = true;
    for (const auto& [task, dep] : g.deps()) {
      ++pending_[task];
      succ_.count_one(dep);
      in_id_order &= dep < task;
    }
    succ_.begin_place();
    // Beside each successor its resource, which a completion marks (read here in dependency order, not
    // at random from the tasks as they complete).
    succ_resource_.resize(succ_.items.size());
    for (const auto& [task, dep] : g.deps()) {
      succ_resource_[succ_.offset[dep]] = tasks_[task].resource;
      succ_.place(dep, task);
    }
    succ_.end_place();
    if (in_id_order)  // graph.h's longest_chain_s, over the successor lists just built
      out_.longest_chain_s = detail::longest_chain_in_id_order(n_, succ_, [&](std::uint32_t t) { return tasks_[t].duration_s; },
                                                               chain_start_);
    out_.start_s.assign(n_, -1.0);
    out_.end_s.assign(n_, -1.0);
    out_.resources.resize(n_res_);
    for (ResourceId r = 0; r < n_res_; ++r) out_.resources[r].name = g.resources()[r].name;
    res_.resize(n_res_);
    for (ResourceId r = 0; r < n_res_; ++r) {
      const Resource& res = g.resources()[r];
      res_[r] = {res.group, res.skew_source, res.skew_fraction, res.contended_rate};
      if (res.skew_source != kNone) skew_source_[res.skew_source] = 1;
    }
  }

  SimResult run() {
    mem_.start_resident();
    for (ResourceId r = 0; r < n_res_; ++r) mark(r);
    start_ready();
    rerate();
    while (n_running_ > 0) {
      // The next event: the earliest finish of a task doing its work, or the start of a skewed task's.
      // (Two running minima: one chain of dependent minima per event was a tenth of the engine's time.)
      double next = kNever, next_odd = kNever;
      ResourceId r = 0;
      for (; r + 1 < n_res_; r += 2) {
        next = std::min(next, next_[r]);
        next_odd = std::min(next_odd, next_[r + 1]);
      }
      if (r < n_res_) next = std::min(next, next_[r]);
      next = std::min(next, next_odd);
      now_ = next;
      ++out_.events;
      // Skewed tasks whose ranks have all arrived begin their work (and take their share of the group).
      if (n_waiting_ > 0) {
        for (ResourceId r = 0; r < n_res_; ++r) {
          Running& x = run_[r];
          if (x.task == kNone || x.in_group || x.work_from > now_) continue;
          x.last = now_;
          x.finish = now_ + x.remaining;
          --n_waiting_;
          join_group(r);
        }
      }
      // Running tasks in a group keep next_ == finish, the others (waiting, idle) next_ > now here. A
      // completion changes only its own resource's next_.
      const double now = now_;
      const double* due = next_.data();
      for (ResourceId r = 0, n = n_res_; r < n; ++r) {
        if (due[r] <= now) complete(r);
      }
      start_ready();
      rerate();
    }
    if (n_done_ != n_) report_deadlock(g_, next_task_, out_.end_s, now_);
    // Each resource's totals summed in its queue's order, the order its tasks completed in.
    for (ResourceId r = 0; r < n_res_; ++r) {
      ResourceResult& rr = out_.resources[r];
      for (TaskId t = first_task_[r]; t != kNone; t = next_on_resource_[t]) {
        rr.busy_s += out_.end_s[t] - out_.start_s[t];
        rr.work_s += tasks_[t].duration_s;
        ++rr.tasks;
      }
    }
    out_.makespan_s = now_;
    out_.pools = mem_.results();
    return std::move(out_);
  }

 private:
  // Rank skew: a source resource's busy seconds since the ranks were last aligned.
  double busy_since_aligned(ResourceId src) const {
    const TaskId t = run_[src].task;
    return since_aligned_[src] + (t != kNone ? now_ - out_.start_s[t] : 0.0);
  }

  // r's ready task may have changed: it finished, or its next task's last dependency did.
  void mark(ResourceId r) { maybe_ready_[r >> 6] |= std::uint64_t{1} << (r & 63); }

  void join_group(ResourceId r) {
    run_[r].in_group = true;
    next_[r] = run_[r].finish;
    if (const GroupId gr = res_[r].group; gr != kNone) {
      ++group_count_[gr];
      group_dirty_[gr] = 1;
    }
  }

  // Completes the task running on r at now: frees, successors, resource bookkeeping.
  void complete(ResourceId r) {
    Running& x = run_[r];
    const TaskId t = x.task;
    out_.end_s[t] = now_;
    const ResourceState& rs = res_[r];
    x.task = kNone;
    next_[r] = kNever;
    mark(r);
    --n_running_;
    ++n_done_;
    if (const GroupId gr = rs.group; gr != kNone && x.in_group) {
      --group_count_[gr];
      group_dirty_[gr] = 1;
    }
    x.in_group = false;
    if (rs.skew_source != kNone) {
      // The source idle: this rank waited for the collective, as every rank did: aligned again.
      if (run_[rs.skew_source].task == kNone) since_aligned_[rs.skew_source] = 0.0;
    } else if (skew_source_[r]) {
      since_aligned_[r] += now_ - out_.start_s[t];
    }
    mem_.on_end(t, now_);
    for (std::uint32_t k = succ_.offset[t]; k < succ_.offset[t + 1]; ++k)
      if (--pending_[succ_.items[k]] == 0) mark(succ_resource_[k]);
  }

  void start(ResourceId r, TaskId t) {
    next_task_[r] = next_on_resource_[t];
    const ResourceState& rs = res_[r];
    const double wait = rs.skew_source != kNone && tasks_[t].duration_s > 0
                            ? rs.skew_fraction * busy_since_aligned(rs.skew_source)
                            : 0.0;
    run_[r] = {t, 1.0, tasks_[t].duration_s, now_, now_ + wait + tasks_[t].duration_s, now_ + wait, false};
    out_.start_s[t] = now_;
    mem_.on_start(t, now_);
    ++n_running_;
    if (wait <= 0) {
      join_group(r);
    } else {
      next_[r] = run_[r].work_from;
      ++n_waiting_;
    }
  }

  TaskId ready_head(ResourceId r) const {
    const TaskId t = next_task_[r];
    return t != kNone && pending_[t] == 0 && run_[r].task == kNone ? t : kNone;
  }

  void unmark(ResourceId r) { maybe_ready_[r >> 6] &= ~(std::uint64_t{1} << (r & 63)); }

  // f(r) for each marked resource in resource order; marks made meanwhile after r count.
  template <class F>
  void for_each_marked(F f) {
    for (std::size_t w = 0; w < maybe_ready_.size(); ++w) {
      std::uint64_t after = ~std::uint64_t{0};
      for (std::uint64_t bits; (bits = maybe_ready_[w] & after) != 0;) {
        const int b = std::countr_zero(bits);
        after = ~((std::uint64_t{2} << b) - 1);  // the bits above b (none above 63)
        f(static_cast<ResourceId>(w * 64 + static_cast<std::size_t>(b)));
      }
    }
  }

  // Start what can start. Tasks too short to move the clock (zero duration) run to completion first,
  // before any longer task starts at this instant, so an instant never shows memory they would free.
  // Passes in resource order as over every resource, over the marked ones only: an unmarked resource
  // has no ready task (every one found ready is started below, and only a completion makes another).
  void start_ready() {
    for (bool again = true; again;) {
      again = false;
      for_each_marked([&](ResourceId r) {
        const TaskId t = ready_head(r);
        if (t == kNone) {
          unmark(r);
          return;
        }
        if (now_ + tasks_[t].duration_s > now_) return;
        start(r, t);
        complete(r);
        again = true;
      });
    }
    // The last pass started nothing: the resources still marked are those with a ready task (a longer one).
    for_each_marked([&](ResourceId r) {
      start(r, next_task_[r]);
      unmark(r);
    });
  }

  // Re-rate the running tasks of groups whose membership changed at now (progress-rate sharing).
  void rerate() {
    for (GroupId gr = 0; gr < n_groups_; ++gr) {
      if (!group_dirty_[gr]) continue;
      group_dirty_[gr] = 0;
      const double share = std::min(1.0, g_.groups()[gr].capacity / std::max<std::uint32_t>(1, group_count_[gr]));
      for (std::uint32_t r : members_.row(gr)) {
        Running& x = run_[r];
        if (x.task == kNone) continue;
        if (!x.in_group) continue;  // waiting for the other ranks: its work has not begun
        // A measured slowdown is one other member's: with k others running it adds k times over (two
        // collectives in flight beside compute take twice the cores one takes).
        const double contended = res_[r].contended_rate;
        const double others = static_cast<double>(group_count_[gr]) - 1.0;
        const double rate = contended > 0 ? 1.0 / (1.0 + others * (1.0 / contended - 1.0)) : share;
        x.remaining = std::max(0.0, x.remaining - x.rate * (now_ - std::max(x.last, x.work_from)));
        x.last = now_;
        x.rate = rate;
        x.finish = std::max(now_, x.work_from) + x.remaining / rate;
        next_[r] = x.finish;
      }
    }
  }

  const TaskGraph& g_;
  const std::vector<Task>& tasks_;
  const std::uint32_t n_, n_res_, n_groups_;
  std::vector<TaskId>& next_on_resource_;  // per task, the next on its resource (kNone: the last)
  detail::Csr& succ_;          // per task, the tasks that depend on it
  std::vector<ResourceId>& succ_resource_;  // beside succ_.items: each one's resource
  const detail::Csr members_;  // per group, its resources
  std::vector<std::uint32_t>& pending_;  // per task, its unfinished dependencies
  std::vector<double>& chain_start_;
  detail::PoolTracker mem_;
  std::vector<TaskId> first_task_;   // per resource, its first task (kNone: none)
  std::vector<TaskId> next_task_;    // per resource, its next task to start (kNone: none left)
  std::vector<Running> run_;         // per resource, what runs on it
  std::vector<std::uint32_t> group_count_;
  std::vector<char> group_dirty_;
  std::vector<double> since_aligned_;
  std::vector<char> skew_source_;
  static constexpr double kNever = std::numeric_limits<double>::infinity();
  // Per resource, what the steps read of it.
  struct ResourceState {
    GroupId group;
    ResourceId skew_source;
    double skew_fraction;
    double contended_rate;
  };
  std::vector<ResourceState> res_;
  // Per resource, when its next event is: its task's finish (doing its work), the start of a skewed
  // task's work (waiting for the other ranks), or never (idle).
  std::vector<double> next_;
  std::vector<std::uint64_t> maybe_ready_;  // per resource, a bit: it may have a task ready to start
  std::uint32_t n_waiting_ = 0;             // running, not yet doing their work (rank skew)
  std::uint32_t n_running_ = 0;
  std::uint32_t n_done_ = 0;
  double now_ = 0;
  SimResult out_;
};

}  // namespace

SimResult run(const TaskGraph& g, bool check_cycles) {
  if (check_cycles) check_acyclic(g);
  thread_local Workspace workspace;
  return EventLoop(g, workspace).run();
}

}  // namespace zeroplan::sim
