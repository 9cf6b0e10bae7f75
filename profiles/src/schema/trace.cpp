#include "zeroplan/profiles/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>

namespace zeroplan {

void append_json_escaped(std::string& out, std::string_view s) {
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
}

void TraceValue::append_json(std::string& out) const {
  if (const auto* i = std::get_if<std::int64_t>(&v_)) {
    fmt::format_to(std::back_inserter(out), "{}", *i);
  } else if (const auto* d = std::get_if<double>(&v_)) {
    if (std::isfinite(*d)) fmt::format_to(std::back_inserter(out), "{}", *d);
    else out += "null";
  } else if (const auto* b = std::get_if<bool>(&v_)) {
    out += *b ? "true" : "false";
  } else {
    out += '"';
    append_json_escaped(out, std::get<std::string>(v_));
    out += '"';
  }
}

namespace {

// ,"args":{"k":v,...} (nothing when empty and not `always`).
void append_trace_args(std::string& out, const TraceArgs& args, bool always) {
  if (args.empty() && !always) return;
  out += ",\"args\":{";
  bool first = true;
  for (const auto& [key, value] : args) {
    if (!first) out += ',';
    first = false;
    out += '"';
    append_json_escaped(out, key);
    out += "\":";
    value.append_json(out);
  }
  out += '}';
}

std::string trace_name_prefix(std::string_view name) {
  std::string out = "{\"name\":\"";
  append_json_escaped(out, name);
  out += '"';
  return out;
}

}  // namespace

void TraceWriter::metadata(std::string_view name, int pid, int tid, TraceArgs args) {
  std::string e = trace_name_prefix(name);
  fmt::format_to(std::back_inserter(e), ",\"ph\":\"M\",\"pid\":{},\"tid\":{}", pid, tid);
  append_trace_args(e, args, true);
  e += '}';
  metadata_.push_back(std::move(e));
}

void TraceWriter::process_name(int pid, std::string_view name) {
  metadata("process_name", pid, 0, {{"name", std::string(name)}});
}

void TraceWriter::thread_name(int pid, int tid, std::string_view name) {
  metadata("thread_name", pid, tid, {{"name", std::string(name)}});
}

void TraceWriter::thread_sort_index(int pid, int tid, int sort_index) {
  metadata("thread_sort_index", pid, tid, {{"sort_index", sort_index}});
}

void TraceWriter::span(std::string_view name, std::string_view cat, double ts_us, double dur_us, int pid, int tid,
                       TraceArgs args) {
  std::string e = trace_name_prefix(name);
  e += ",\"cat\":\"";
  append_json_escaped(e, cat);
  fmt::format_to(std::back_inserter(e), "\",\"ph\":\"X\",\"ts\":{:.3f},\"dur\":{:.3f},\"pid\":{},\"tid\":{}", ts_us,
                 dur_us, pid, tid);
  append_trace_args(e, args, false);
  e += '}';
  spans_.push_back({pid, tid, ts_us, std::move(e)});
}

void TraceWriter::counter(std::string_view name, double ts_us, int pid, TraceArgs args) {
  std::string e = trace_name_prefix(name);
  fmt::format_to(std::back_inserter(e), ",\"ph\":\"C\",\"ts\":{:.3f},\"pid\":{}", ts_us, pid);
  append_trace_args(e, args, true);
  e += '}';
  counters_.push_back(std::move(e));
}

void TraceWriter::raw(std::string json_object) { raw_.push_back(std::move(json_object)); }

std::string TraceWriter::json() const {
  std::vector<std::size_t> order(spans_.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const Span& x = spans_[a];
    const Span& y = spans_[b];
    if (x.pid != y.pid) return x.pid < y.pid;
    if (x.tid != y.tid) return x.tid < y.tid;
    return x.ts_us < y.ts_us;
  });
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  bool first = true;
  auto emit = [&](const std::string& e) {
    out += first ? "\n" : ",\n";
    first = false;
    out += e;
  };
  for (const std::string& e : metadata_) emit(e);
  for (std::size_t i : order) emit(spans_[i].text);
  for (const std::string& e : counters_) emit(e);
  for (const std::string& e : raw_) emit(e);
  out += "\n]}\n";
  return out;
}

}  // namespace zeroplan
