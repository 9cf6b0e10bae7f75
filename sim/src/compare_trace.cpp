// The trace overlay of `compare --trace`: a predicted and a measured Chrome trace in one file, the
// measured step aligned with the predicted one (see compare.h).
#include "zeroplan/sim/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/trace.h"

namespace zeroplan::sim {

namespace {

using ojson = nlohmann::ordered_json;

const ojson& events_of(const ojson& trace, const std::string& which) {
  if (trace.is_array()) return trace;
  if (trace.is_object()) {
    auto it = trace.find("traceEvents");
    if (it != trace.end() && it->is_array()) return *it;
  }
  throw SchemaError(which + " trace: neither an array of events nor an object with a \"traceEvents\" array");
}

ojson parse_trace(const std::string& text, const std::string& which) {
  try {
    // A trace is events in an array, a few levels deep: a bound keeps a hostile file from overflowing
    // the stack in the recursive copy and destruction.
    constexpr int kMaxDepth = 64;
    return ojson::parse(text, [&](int depth, ojson::parse_event_t event, ojson&) {
      if ((event == ojson::parse_event_t::object_start || event == ojson::parse_event_t::array_start) &&
          depth >= kMaxDepth)
        throw SchemaError(fmt::format("{} trace: nested deeper than {} levels", which, kMaxDepth));
      return true;
    });
  } catch (const nlohmann::json::parse_error& e) {
    throw SchemaError(fmt::format("{} trace: invalid JSON at byte {}", which, e.byte));
  } catch (const nlohmann::json::out_of_range& e) {
    throw SchemaError(fmt::format("{} trace: a number out of range", which));
  }
}

bool is_span(const ojson& e) {
  auto ph = e.find("ph");
  auto ts = e.find("ts");
  return ph != e.end() && ph->is_string() && *ph == "X" && ts != e.end() && ts->is_number();
}

int step_of(const ojson& e) {
  auto args = e.find("args");
  if (args == e.end() || !args->is_object()) return -1;
  auto s = args->find("step");
  return s != args->end() && s->is_number_integer() ? s->get<int>() : -1;
}

bool is_warmup(const ojson& e) {
  auto args = e.find("args");
  if (args == e.end() || !args->is_object()) return false;
  auto w = args->find("warmup");
  return w != args->end() && w->is_boolean() && w->get<bool>();
}

// Start (ts, us) of the step to align and which step it is (-1: the trace has no steps).
std::pair<double, int> step_start(const ojson& events, int want_step) {
  int step = want_step;
  if (step < 0) {
    int first_measured = std::numeric_limits<int>::max(), first_any = std::numeric_limits<int>::max();
    for (const ojson& e : events) {
      if (!e.is_object() || !is_span(e)) continue;
      const int s = step_of(e);
      if (s < 0) continue;
      first_any = std::min(first_any, s);
      if (!is_warmup(e)) first_measured = std::min(first_measured, s);
    }
    step = first_measured != std::numeric_limits<int>::max() ? first_measured
           : first_any != std::numeric_limits<int>::max()    ? first_any
                                                              : -1;
  }
  double start = std::numeric_limits<double>::infinity();
  for (const ojson& e : events) {
    if (!e.is_object() || !is_span(e)) continue;
    if (step >= 0 && step_of(e) != step) continue;
    start = std::min(start, e["ts"].get<double>());
  }
  return {std::isfinite(start) ? start : 0.0, step};
}

bool replaced_metadata(const ojson& e) {
  auto ph = e.find("ph");
  auto name = e.find("name");
  return ph != e.end() && *ph == "M" && name != e.end() &&
         (*name == "process_name" || *name == "process_sort_index" || *name == "process_labels");
}

double min_ts(const ojson& events) {
  double m = std::numeric_limits<double>::infinity();
  for (const ojson& e : events) {
    if (!e.is_object()) continue;
    auto ts = e.find("ts");
    if (ts != e.end() && ts->is_number()) m = std::min(m, ts->get<double>());
  }
  return m;
}

void append_process(TraceWriter& out, const ojson& events, int pid, const std::string& name,
                    const std::string& label, double shift_us, const std::string& which) {
  // Raw events keep their order: each process's metadata, then its events as they were.
  auto emit = [&](const ojson& e) { out.raw(e.dump()); };
  emit(ojson{{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", name}}}});
  emit(ojson{{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"sort_index", pid}}}});
  if (!label.empty())
    emit(ojson{{"name", "process_labels"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"labels", label}}}});
  std::size_t index = 0;
  for (const ojson& e : events) {
    if (!e.is_object()) throw SchemaError(fmt::format("{} trace: event {} is not an object", which, index));
    ++index;
    if (replaced_metadata(e)) continue;
    ojson copy = e;
    copy["pid"] = pid;
    auto ts = copy.find("ts");
    if (ts != copy.end() && ts->is_number()) *ts = std::round((ts->get<double>() + shift_us) * 1e3) / 1e3;
    emit(copy);
  }
}

}  // namespace

std::string overlay_traces(const std::string& predicted_trace_json, const std::string& measured_trace_json,
                           const OverlayOptions& options) {
  const ojson predicted = parse_trace(predicted_trace_json, "predicted");
  const ojson measured = parse_trace(measured_trace_json, "measured");
  const ojson& pe = events_of(predicted, "predicted");
  const ojson& me = events_of(measured, "measured");
  const auto [p_start, p_step] = step_start(pe, -1);
  const auto [m_start, m_step] = step_start(me, options.measured_step);
  // Both aligned steps start at `at`; nothing before 0.
  double at = std::max(p_start, m_start);
  const double lowest = std::min(min_ts(pe) + (at - p_start), min_ts(me) + (at - m_start));
  if (std::isfinite(lowest) && lowest < 0) at -= lowest;
  const std::string label = m_step >= 0 ? fmt::format("step {} aligned with the predicted step", m_step) : "";
  TraceWriter out;
  append_process(out, pe, 1, "predicted", p_step >= 0 ? fmt::format("step {}", p_step) : "", at - p_start,
                 "predicted");
  append_process(out, me, 2, "measured", label, at - m_start, "measured");
  return out.json();
}

}  // namespace zeroplan::sim
