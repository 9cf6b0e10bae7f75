#include "zeroplan/sim/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace zeroplan::sim {

namespace {

void append_escaped(fmt::memory_buffer& out, std::string_view s) {
  for (char c : s) {
    switch (c) {
      case '"': out.append(std::string_view("\\\"")); break;
      case '\\': out.append(std::string_view("\\\\")); break;
      case '\n': out.append(std::string_view("\\n")); break;
      case '\t': out.append(std::string_view("\\t")); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<int>(c));
        } else {
          out.push_back(c);
        }
    }
  }
}

}  // namespace

std::string chrome_trace_json(const TaskGraph& g, const SimResult& r, const TraceOptions& opt) {
  fmt::memory_buffer out;
  auto it = std::back_inserter(out);
  bool first = true;
  auto sep = [&] {
    out.append(std::string_view(first ? "\n" : ",\n"));
    first = false;
  };
  out.append(std::string_view("{\"displayTimeUnit\":\"ms\",\"traceEvents\":["));
  sep();
  out.append(std::string_view("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":"));
  fmt::format_to(it, "{},\"tid\":0,\"args\":{{\"name\":\"", opt.pid);
  append_escaped(out, opt.process_name);
  out.append(std::string_view("\"}}"));
  const auto& res = g.resources();
  for (std::size_t i = 0; i < res.size(); ++i) {
    sep();
    fmt::format_to(it, "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"", opt.pid, i);
    append_escaped(out, res[i].name);
    out.append(std::string_view("\"}}"));
    sep();
    fmt::format_to(it, "{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"sort_index\":{}}}}}",
                   opt.pid, i, i);
  }
  // Spans: by resource, then by start (FIFO order within a resource is start order).
  std::vector<TaskId> order(g.num_tasks());
  std::iota(order.begin(), order.end(), TaskId{0});
  std::stable_sort(order.begin(), order.end(), [&](TaskId a, TaskId b) {
    const auto& ta = g.tasks()[a];
    const auto& tb = g.tasks()[b];
    if (ta.resource != tb.resource) return ta.resource < tb.resource;
    return r.start_s[a] < r.start_s[b];
  });
  for (TaskId t : order) {
    const Task& task = g.tasks()[t];
    if (r.start_s[t] < 0) continue;
    sep();
    out.append(std::string_view("{\"name\":\""));
    append_escaped(out, g.task_name(t));
    out.append(std::string_view("\",\"cat\":\""));
    append_escaped(out, g.name(task.category));
    fmt::format_to(it, "\",\"ph\":\"X\",\"ts\":{:.3f},\"dur\":{:.3f},\"pid\":{},\"tid\":{}", r.start_s[t] * 1e6,
                   (r.end_s[t] - r.start_s[t]) * 1e6, opt.pid, task.resource);
    fmt::format_to(it, ",\"args\":{{\"id\":{}", t);
    if (task.label.unit >= 0) fmt::format_to(it, ",\"unit\":{}", task.label.unit);
    if (task.label.microbatch >= 0) fmt::format_to(it, ",\"microbatch\":{}", task.label.microbatch);
    out.append(std::string_view("}}"));
  }
  for (const PoolResult& p : r.pools) {
    for (const auto& [time_s, bytes] : p.timeline) {
      sep();
      out.append(std::string_view("{\"name\":\"memory "));
      append_escaped(out, p.name);
      fmt::format_to(it, "\",\"ph\":\"C\",\"ts\":{:.3f},\"pid\":{},\"args\":{{\"bytes\":{}}}}}", time_s * 1e6, opt.pid,
                     bytes);
    }
  }
  out.append(std::string_view("\n]}\n"));
  return fmt::to_string(out);
}

}  // namespace zeroplan::sim
