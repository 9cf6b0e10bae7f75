// Chrome trace-event JSON (Perfetto, chrome://tracing): the one trace schema that the profiler, the
// simulator and the executor write, so the three line up in one viewer and in memory_timeline.ipynb.
//
// A TraceWriter collects process / thread metadata ("ph":"M"), complete spans ("ph":"X") and counters
// ("ph":"C"; memory counters are named "memory <pool>" with args bytes and, where known, peak_bytes).
// Times are microseconds. json() is deterministic, so the same calls give byte-identical text:
//   {"displayTimeUnit":"ms","traceEvents":[ one event a line: metadata in the order added; spans ordered
//   by (pid, tid, ts), ties in the order added; counters in the order added; raw events in the order
//   added ]}
// ts and dur print with three decimals (nanoseconds), integers as integers, other numbers in the
// shortest form that reads back the same (non-finite ones as null); strings are JSON-escaped.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace zeroplan {

// One event argument: an integer, a number, a boolean or a string.
class TraceValue {
 public:
  template <std::integral T>
    requires(!std::same_as<T, bool>)
  TraceValue(T v) : v_(static_cast<std::int64_t>(v)) {}  // NOLINT(google-explicit-constructor)
  TraceValue(double v) : v_(v) {}                         // NOLINT(google-explicit-constructor)
  TraceValue(bool v) : v_(v) {}                           // NOLINT(google-explicit-constructor)
  TraceValue(std::string v) : v_(std::move(v)) {}        // NOLINT(google-explicit-constructor)
  TraceValue(const char* v) : v_(std::string(v)) {}       // NOLINT(google-explicit-constructor)

  // Appends the JSON text of the value.
  void append_json(std::string& out) const;

 private:
  std::variant<std::int64_t, double, bool, std::string> v_;
};

// Arguments in the order they are written.
using TraceArgs = std::vector<std::pair<std::string, TraceValue>>;

class TraceWriter {
 public:
  // Metadata event NAME with args, e.g. metadata("process_labels", pid, 0, {{"labels", "step 3"}}).
  void metadata(std::string_view name, int pid, int tid, TraceArgs args);
  // The three metadata events every producer writes.
  void process_name(int pid, std::string_view name);
  void thread_name(int pid, int tid, std::string_view name);
  void thread_sort_index(int pid, int tid, int sort_index);

  // A complete span from ts_us for dur_us on (pid, tid).
  void span(std::string_view name, std::string_view cat, double ts_us, double dur_us, int pid, int tid,
            TraceArgs args = {});
  // A counter sample at ts_us: each arg (numbers) is a series of the counter NAME.
  void counter(std::string_view name, double ts_us, int pid, TraceArgs args);
  // An event already serialised as one JSON object (copied from another trace), written as given.
  // REQUIRES: json_object is one JSON object on one line.
  void raw(std::string json_object);

  std::size_t num_spans() const { return spans_.size(); }
  std::size_t num_counters() const { return counters_.size(); }

  std::string json() const;

 private:
  struct Span {
    int pid, tid;
    double ts_us;
    std::string text;
  };
  std::vector<std::string> metadata_;
  std::vector<Span> spans_;
  std::vector<std::string> counters_;
  std::vector<std::string> raw_;
};

// Appends s as the inside of a JSON string: '"' and '\\' escaped, control characters as \n, \t, \r,
// \b, \f or \u00XX; other bytes as they are.
void append_json_escaped(std::string& out, std::string_view s);

}  // namespace zeroplan
