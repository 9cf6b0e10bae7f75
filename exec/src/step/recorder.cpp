#include "zeroplan/exec/recorder.h"

#include <algorithm>
#include <utility>

#include "zeroplan/profiles/trace.h"

namespace zeroplan::exec {

const char* lane_name(Lane lane) {
  switch (lane) {
    case Lane::compute: return "compute";
    case Lane::comm: return "comm";
    case Lane::h2d: return "h2d";
    case Lane::d2h: return "d2h";
    case Lane::optimizer: return "optimizer";
    case Lane::comm_rs: return "comm.rs";
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

std::string Recorder::chrome_trace_json() const {
  TraceWriter w;
  w.process_name(rank_, "zeroplan run rank " + std::to_string(rank_));
  for (int i = 0; i <= static_cast<int>(Lane::comm_rs); ++i) {
    w.thread_name(rank_, i, lane_name(static_cast<Lane>(i)));
    w.thread_sort_index(rank_, i, i);
  }
  for (const Span& s : spans_) {
    TraceArgs args{{"step", s.step}};
    if (s.warmup) args.emplace_back("warmup", true);
    if (s.unit >= 0) args.emplace_back("unit", s.unit);
    if (s.microbatch >= 0) args.emplace_back("microbatch", s.microbatch);
    w.span(s.name, lane_name(s.lane), s.t0_s * 1e6, std::max(0.0, s.t1_s - s.t0_s) * 1e6, rank_,
           static_cast<int>(s.lane), std::move(args));
  }
  for (const MemorySample& m : memory_) {
    w.counter("memory device", m.t_s * 1e6, rank_, {{"bytes", m.live}, {"peak_bytes", m.peak}});
  }
  return w.json();
}

}  // namespace zeroplan::exec
