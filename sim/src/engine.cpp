// The event loop, SimGrid style: start what can start, find the next completion, move the clock there,
// fire the completions in resource order, repeat. Resources run their tasks in the order they were added.
#include "zeroplan/sim/engine.h"

#include <fmt/format.h>

#include <algorithm>
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

[[noreturn]] void report_deadlock(const TaskGraph& g, const detail::Csr& queue, const std::vector<std::uint32_t>& head,
                                  const std::vector<double>& end, double now) {
  const auto& res = g.resources();
  for (ResourceId r = 0; r < res.size(); ++r) {
    if (head[r] >= queue.row(r).size()) continue;
    const TaskId t = queue.row(r)[head[r]];
    for (const auto& [task, dep] : g.deps()) {
      if (task != t || end[dep] >= 0) continue;
      const ResourceId dr = g.tasks()[dep].resource;
      const TaskId blocker = queue.row(dr)[head[dr]];
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

}  // namespace

SimResult run(const TaskGraph& g, bool check_cycles) {
  if (check_cycles) check_acyclic(g);
  const auto& tasks = g.tasks();
  const auto& deps = g.deps();
  const auto n = static_cast<std::uint32_t>(tasks.size());
  const auto n_res = static_cast<std::uint32_t>(g.resources().size());
  const auto n_groups = static_cast<std::uint32_t>(g.groups().size());

  const auto queue = detail::Csr::build(n_res, n, [&](std::uint32_t i) { return tasks[i].resource; },
                                        [](std::uint32_t i) { return i; });
  const auto succ = detail::Csr::build(n, static_cast<std::uint32_t>(deps.size()),
                                       [&](std::uint32_t i) { return deps[i].second; },
                                       [&](std::uint32_t i) { return deps[i].first; });
  const auto members = detail::Csr::build(n_groups, n_res, [&](std::uint32_t r) { return g.resources()[r].group; },
                                          [](std::uint32_t r) { return r; }, kNone);
  std::vector<std::uint32_t> pending(n, 0);
  for (const auto& d : deps) ++pending[d.first];

  SimResult out;
  out.start_s.assign(n, -1.0);
  out.end_s.assign(n, -1.0);
  out.resources.resize(n_res);
  for (ResourceId r = 0; r < n_res; ++r) out.resources[r].name = g.resources()[r].name;

  detail::PoolTracker mem(g);
  mem.start_resident();
  std::vector<std::uint32_t> head(n_res, 0);
  std::vector<Running> run(n_res);
  std::vector<std::uint32_t> group_count(n_groups, 0);
  std::vector<char> group_dirty(n_groups, 0);
  std::uint32_t n_running = 0;
  std::uint32_t n_done = 0;
  double now = 0;
  // Rank skew: per source resource, its busy seconds since the ranks were last aligned.
  std::vector<double> since_aligned(n_res, 0.0);
  std::vector<char> skew_source(n_res, 0);
  for (const Resource& res : g.resources())
    if (res.skew_source != kNone) skew_source[res.skew_source] = 1;
  auto busy_since_aligned = [&](ResourceId src) {
    const TaskId t = run[src].task;
    return since_aligned[src] + (t != kNone ? now - out.start_s[t] : 0.0);
  };
  auto join_group = [&](ResourceId r) {
    run[r].in_group = true;
    if (const GroupId gr = g.resources()[r].group; gr != kNone) {
      ++group_count[gr];
      group_dirty[gr] = 1;
    }
  };

  // Completes the task running on r at `now`: frees, successors, resource bookkeeping.
  auto complete = [&](ResourceId r) {
    Running& x = run[r];
    const TaskId t = x.task;
    out.end_s[t] = now;
    out.resources[r].busy_s += now - out.start_s[t];
    out.resources[r].work_s += tasks[t].duration_s;
    ++out.resources[r].tasks;
    x.task = kNone;
    --n_running;
    ++n_done;
    if (const GroupId gr = g.resources()[r].group; gr != kNone && x.in_group) {
      --group_count[gr];
      group_dirty[gr] = 1;
    }
    x.in_group = false;
    const Resource& res = g.resources()[r];
    if (res.skew_source != kNone) {
      // The source idle: this rank waited for the collective, as every rank did: aligned again.
      if (run[res.skew_source].task == kNone) since_aligned[res.skew_source] = 0.0;
    } else if (skew_source[r]) {
      since_aligned[r] += now - out.start_s[t];
    }
    mem.on_end(t, now);
    for (std::uint32_t s : succ.row(t)) --pending[s];
  };
  auto start = [&](ResourceId r, TaskId t) {
    ++head[r];
    const Resource& res = g.resources()[r];
    const double wait = res.skew_source != kNone && tasks[t].duration_s > 0
                            ? res.skew_fraction * busy_since_aligned(res.skew_source)
                            : 0.0;
    run[r] = {t, 1.0, tasks[t].duration_s, now, now + wait + tasks[t].duration_s, now + wait, false};
    out.start_s[t] = now;
    mem.on_start(t, now);
    ++n_running;
    if (wait <= 0) join_group(r);
  };
  auto ready_head = [&](ResourceId r) -> TaskId {
    if (run[r].task != kNone || head[r] >= queue.row(r).size()) return kNone;
    const TaskId t = queue.row(r)[head[r]];
    return pending[t] == 0 ? t : kNone;
  };
  // Start what can start. Tasks too short to move the clock (zero duration) run to completion first,
  // before any longer task starts at this instant, so an instant never shows memory they would free.
  auto start_ready = [&] {
    for (bool again = true; again;) {
      again = false;
      for (ResourceId r = 0; r < n_res; ++r) {
        const TaskId t = ready_head(r);
        if (t == kNone || now + tasks[t].duration_s > now) continue;
        start(r, t);
        complete(r);
        again = true;
      }
    }
    for (ResourceId r = 0; r < n_res; ++r) {
      if (const TaskId t = ready_head(r); t != kNone) start(r, t);
    }
  };
  // Re-rate the running tasks of groups whose membership changed at `now` (progress-rate sharing).
  auto rerate = [&] {
    for (GroupId gr = 0; gr < n_groups; ++gr) {
      if (!group_dirty[gr]) continue;
      group_dirty[gr] = 0;
      const double share = std::min(1.0, g.groups()[gr].capacity / std::max<std::uint32_t>(1, group_count[gr]));
      for (std::uint32_t r : members.row(gr)) {
        Running& x = run[r];
        if (x.task == kNone) continue;
        if (!x.in_group) continue;  // waiting for the other ranks: its work has not begun
        // A measured slowdown is one other member's: with k others running it adds k times over (two
        // collectives in flight beside compute take twice the cores one takes).
        const double contended = g.resources()[r].contended_rate;
        const double others = static_cast<double>(group_count[gr]) - 1.0;
        const double rate = contended > 0 ? 1.0 / (1.0 + others * (1.0 / contended - 1.0)) : share;
        x.remaining = std::max(0.0, x.remaining - x.rate * (now - std::max(x.last, x.work_from)));
        x.last = now;
        x.rate = rate;
        x.finish = std::max(now, x.work_from) + x.remaining / rate;
      }
    }
  };

  start_ready();
  rerate();
  while (n_running > 0) {
    double next = std::numeric_limits<double>::infinity();
    for (ResourceId r = 0; r < n_res; ++r) {
      if (run[r].task == kNone) continue;
      next = std::min(next, run[r].in_group ? run[r].finish : run[r].work_from);
    }
    now = next;
    ++out.events;
    // Skewed tasks whose ranks have all arrived begin their work (and take their share of the group).
    for (ResourceId r = 0; r < n_res; ++r) {
      Running& x = run[r];
      if (x.task == kNone || x.in_group || x.work_from > now) continue;
      x.last = now;
      x.finish = now + x.remaining;
      join_group(r);
    }
    for (ResourceId r = 0; r < n_res; ++r) {
      if (run[r].task != kNone && run[r].in_group && run[r].finish <= now) complete(r);
    }
    start_ready();
    rerate();
  }
  if (n_done != n) report_deadlock(g, queue, head, out.end_s, now);
  out.makespan_s = now;
  out.pools = mem.results();
  return out;
}

}  // namespace zeroplan::sim
