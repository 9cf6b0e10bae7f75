#include "zeroplan/sim/trace.h"

#include "zeroplan/profiles/trace.h"

namespace zeroplan::sim {

std::string chrome_trace_json(const TaskGraph& g, const SimResult& r, const TraceOptions& opt) {
  TraceWriter w;
  w.process_name(opt.pid, opt.process_name);
  const auto& res = g.resources();
  for (std::size_t i = 0; i < res.size(); ++i) {
    w.thread_name(opt.pid, static_cast<int>(i), res[i].name);
    w.thread_sort_index(opt.pid, static_cast<int>(i), static_cast<int>(i));
  }
  // Spans in task order; the writer orders them by resource, then start (FIFO order within a
  // resource is start order).
  for (TaskId t = 0; t < static_cast<TaskId>(g.num_tasks()); ++t) {
    const Task& task = g.tasks()[t];
    if (r.start_s[t] < 0) continue;
    TraceArgs args{{"id", t}};
    if (task.label.unit >= 0) args.emplace_back("unit", task.label.unit);
    if (task.label.microbatch >= 0) args.emplace_back("microbatch", task.label.microbatch);
    w.span(g.task_name(t), g.name(task.category), r.start_s[t] * 1e6, (r.end_s[t] - r.start_s[t]) * 1e6, opt.pid,
           static_cast<int>(task.resource), std::move(args));
  }
  for (const PoolResult& p : r.pools) {
    for (const auto& [time_s, bytes] : p.timeline) {
      w.counter("memory " + p.name, time_s * 1e6, opt.pid, {{"bytes", bytes}});
    }
  }
  return w.json();
}

}  // namespace zeroplan::sim
