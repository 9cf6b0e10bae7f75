#include "zeroplan/exec/recorder.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace zeroplan::exec {

const char* lane_name(Lane lane) {
  switch (lane) {
    case Lane::compute: return "compute";
    case Lane::comm: return "comm";
    case Lane::h2d: return "h2d";
    case Lane::d2h: return "d2h";
    case Lane::optimizer: return "optimizer";
  }
  return "?";
}

Recorder::Recorder(int rank, bool keep_spans)
    : rank_(rank), keep_spans_(keep_spans), origin_(std::chrono::steady_clock::now()) {}

double Recorder::now_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_).count();
}

void Recorder::begin_step(int step, bool warmup) {
  step_ = step;
  warmup_ = warmup;
  phases_.clear();
  units_.clear();
}

std::map<std::string, double> Recorder::end_step() { return std::exchange(phases_, {}); }

std::map<int, Recorder::UnitStepTime> Recorder::unit_times() const {
  std::map<int, UnitStepTime> out;
  for (const auto& [unit, acc] : units_) {
    out[unit] = {acc.fwd_s, acc.bwd_s, static_cast<int>(acc.microbatches.size())};
  }
  return out;
}

void Recorder::add_phase(const std::string& phase, double seconds) { phases_[phase] += seconds; }

void Recorder::span(Lane lane, const std::string& name, double t0_s, double t1_s, const std::string& phase,
                    int unit, int microbatch) {
  if (!phase.empty()) phases_[phase] += t1_s - t0_s;
  if (unit >= 0 && (phase == "forward" || phase == "backward")) {
    UnitAcc& u = units_[unit];
    (phase == "forward" ? u.fwd_s : u.bwd_s) += t1_s - t0_s;
    u.microbatches.insert(microbatch);
  }
  const std::int64_t peak = peak_probe_ ? peak_probe_() : -1;
  if (keep_spans_ && live_probe_) memory_.push_back({t1_s, live_probe_(), peak});
  if (peak_probe_) {
    if (peak > peak_seen_) {
      peak_seen_ = peak;
      peak_at_ = name + " (step " + std::to_string(step_) + (microbatch >= 0 ? ", microbatch " + std::to_string(microbatch) : "") + ")";
    }
  }
  if (keep_spans_) spans_.push_back({lane, name, t0_s, t1_s, unit, microbatch, step_, warmup_});
}

namespace {

void append_escaped(std::string& out, const std::string& s) {
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<int>(c));
      out += buf;
    } else {
      out += c;
    }
  }
}

}  // namespace

std::string Recorder::chrome_trace_json() const {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"zeroplan run rank %d\"}}",
                rank_, rank_);
  out += buf;
  for (int i = 0; i <= static_cast<int>(Lane::optimizer); ++i) {
    std::snprintf(buf, sizeof(buf),
                  ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}"
                  ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                  rank_, i, lane_name(static_cast<Lane>(i)), rank_, i, i);
    out += buf;
  }
  std::vector<const Span*> order;
  for (const auto& s : spans_) order.push_back(&s);
  std::stable_sort(order.begin(), order.end(), [](const Span* a, const Span* b) {
    if (a->lane != b->lane) return a->lane < b->lane;
    return a->t0_s < b->t0_s;
  });
  for (const Span* s : order) {
    out += ",\n{\"name\":\"";
    append_escaped(out, s->name);
    std::snprintf(buf, sizeof(buf),
                  "\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,\"args\":{\"step\":%d",
                  lane_name(s->lane), s->t0_s * 1e6, std::max(0.0, s->t1_s - s->t0_s) * 1e6, rank_,
                  static_cast<int>(s->lane), s->step);
    out += buf;
    if (s->warmup) out += ",\"warmup\":true";
    if (s->unit >= 0) out += ",\"unit\":" + std::to_string(s->unit);
    if (s->microbatch >= 0) out += ",\"microbatch\":" + std::to_string(s->microbatch);
    out += "}}";
  }
  for (const MemorySample& m : memory_) {
    std::snprintf(buf, sizeof(buf),
                  ",\n{\"name\":\"memory device\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":%d,\"args\":{\"bytes\":%lld,"
                  "\"peak_bytes\":%lld}}",
                  m.t_s * 1e6, rank_, static_cast<long long>(m.live), static_cast<long long>(m.peak));
    out += buf;
  }
  out += "\n]}\n";
  return out;
}

}  // namespace zeroplan::exec
