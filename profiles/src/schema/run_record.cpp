#include "zeroplan/profiles/run_record.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "json_util.h"

namespace zeroplan {

namespace {

constexpr const char* kRunRecordWhere = "run_record";

[[noreturn]] void record_error(const std::string& message) { fail(kRunRecordWhere, message); }

// Losses may be NaN or infinite (an fp16 overflow step): written as null, read back as NaN.
struct Losses {
  std::vector<double>* values;
};

void read_value(const nlohmann::json& j, Losses& losses, const std::string& path) {
  if (!j.is_array()) fail(path, "expected an array, got " + describe(j));
  losses.values->clear();
  for (std::size_t i = 0; i < j.size(); ++i) {
    if (j[i].is_null()) {
      losses.values->push_back(std::numeric_limits<double>::quiet_NaN());
      continue;
    }
    double v = 0;
    zeroplan::read_value(j[i], v, path + "[" + std::to_string(i) + "]");
    losses.values->push_back(v);
  }
}

ojson write_losses(const std::vector<double>& losses) {
  ojson a = ojson::array();
  for (double v : losses) {
    if (std::isfinite(v))
      a.push_back(v);
    else
      a.push_back(nullptr);
  }
  return a;
}

ojson write_environment(const RunEnvironment& e) {
  ojson j;
  j["hostname"] = e.hostname;
  j["backend"] = e.backend;
  j["device"] = e.device;
  j["threads_per_rank"] = e.threads_per_rank;
  j["torch_version"] = e.torch_version;
  j["zeroplan_version"] = e.zeroplan_version;
  j["ranks"] = e.ranks;
  if (e.cores > 0) j["cores"] = e.cores;
  if (e.other_load_cores >= 0) j["other_load_cores"] = e.other_load_cores;
  return j;
}

ojson write_peak(const RankPeak& p) {
  ojson j;
  j["rank"] = p.rank;
  j["device_peak_bytes"] = p.device_peak_bytes;
  j["host_peak_bytes"] = p.host_peak_bytes;
  if (!p.device_peak_at.empty()) j["device_peak_at"] = p.device_peak_at;
  if (p.host_reserved_bytes > 0) j["host_reserved_bytes"] = p.host_reserved_bytes;
  return j;
}

ojson write_unit_phase_time(const UnitPhaseTime& u) {
  ojson j;
  j["name"] = u.name;
  j["fwd_s"] = u.fwd_s;
  j["bwd_s"] = u.bwd_s;
  return j;
}

ojson write_run_stage(const RunStage& s) {
  ojson j;
  j["stage"] = s.stage;
  j["first_unit"] = s.first_unit;
  j["units"] = s.units;
  j["ranks"] = s.ranks;
  j["device_peak_bytes"] = s.device_peak_bytes;
  j["host_peak_bytes"] = s.host_peak_bytes;
  j["compute_busy_s"] = s.compute_busy_s;
  return j;
}

ojson write_offloaded(const OffloadedActivations& o) {
  ojson j;
  j["unit"] = o.unit;
  j["name"] = o.name;
  j["tensors"] = o.tensors;
  j["offloaded"] = o.offloaded;
  j["bytes"] = o.bytes;
  j["offloaded_bytes"] = o.offloaded_bytes;
  return j;
}

bool same_double(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

}  // namespace

void read_value(const nlohmann::json& j, RunEnvironment& e, const std::string& path) {
  ObjectReader r(j, path);
  r.req("hostname", e.hostname);
  r.req("backend", e.backend);
  r.req("device", e.device);
  r.req("threads_per_rank", e.threads_per_rank);
  r.req("torch_version", e.torch_version);
  r.req("zeroplan_version", e.zeroplan_version);
  r.req("ranks", e.ranks);
  r.opt("cores", e.cores);
  r.opt("other_load_cores", e.other_load_cores);
  r.finish();
}

void read_value(const nlohmann::json& j, RankPeak& p, const std::string& path) {
  ObjectReader r(j, path);
  r.req("rank", p.rank);
  r.req("device_peak_bytes", p.device_peak_bytes);
  r.req("host_peak_bytes", p.host_peak_bytes);
  r.opt("device_peak_at", p.device_peak_at);
  r.opt("host_reserved_bytes", p.host_reserved_bytes);
  r.finish();
}

void read_value(const nlohmann::json& j, RunStage& s, const std::string& path) {
  ObjectReader r(j, path);
  r.req("stage", s.stage);
  r.req("first_unit", s.first_unit);
  r.req("units", s.units);
  r.req("ranks", s.ranks);
  r.req("device_peak_bytes", s.device_peak_bytes);
  r.req("host_peak_bytes", s.host_peak_bytes);
  r.opt("compute_busy_s", s.compute_busy_s);
  r.finish();
}

void read_value(const nlohmann::json& j, OffloadedActivations& o, const std::string& path) {
  ObjectReader r(j, path);
  r.req("unit", o.unit);
  r.req("name", o.name);
  r.req("tensors", o.tensors);
  r.req("offloaded", o.offloaded);
  r.req("bytes", o.bytes);
  r.req("offloaded_bytes", o.offloaded_bytes);
  r.finish();
}

void read_value(const nlohmann::json& j, UnitPhaseTime& u, const std::string& path) {
  ObjectReader r(j, path);
  r.req("name", u.name);
  r.req("fwd_s", u.fwd_s);
  r.req("bwd_s", u.bwd_s);
  r.finish();
}

double percentile(std::vector<double> values, double q) {
  assert(!values.empty());
  std::sort(values.begin(), values.end());
  const double rank = q / 100.0 * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(rank));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

std::vector<double> RunRecord::measured_step_times_s() const {
  const auto skip = static_cast<std::size_t>(std::clamp<int>(warmup_steps, 0, static_cast<int>(step_times_s.size())));
  return std::vector<double>(step_times_s.begin() + static_cast<std::ptrdiff_t>(skip), step_times_s.end());
}

void RunRecord::compute_step_statistics() {
  const std::vector<double> measured = measured_step_times_s();
  assert(!measured.empty());
  step_time_median_s = percentile(measured, 50);
  step_time_p10_s = percentile(measured, 10);
  step_time_p90_s = percentile(measured, 90);
}

bool RunRecord::operator==(const RunRecord& o) const {
  return model == o.model && plan == o.plan && environment == o.environment && warmup_steps == o.warmup_steps &&
         step_times_s == o.step_times_s && step_time_median_s == o.step_time_median_s &&
         step_time_p10_s == o.step_time_p10_s && step_time_p90_s == o.step_time_p90_s &&
         phase_times_s == o.phase_times_s && peaks == o.peaks &&
         std::equal(losses.begin(), losses.end(), o.losses.begin(), o.losses.end(), same_double) && units == o.units &&
         lr_gains == o.lr_gains && fallbacks == o.fallbacks && trace_paths == o.trace_paths &&
         loss_scales == o.loss_scales && skipped_steps == o.skipped_steps && stages == o.stages &&
         bubble_fraction == o.bubble_fraction && offloaded_activations == o.offloaded_activations;
}

ojson to_ordered_json(const RunRecord& r) {
  ojson j;
  j["schema"] = kRunRecordSchema;
  j["model"] = r.model;
  j["environment"] = write_environment(r.environment);
  j["warmup_steps"] = r.warmup_steps;
  j["step_times_s"] = r.step_times_s;
  j["step_time_median_s"] = r.step_time_median_s;
  j["step_time_p10_s"] = r.step_time_p10_s;
  j["step_time_p90_s"] = r.step_time_p90_s;
  j["phase_times_s"] = r.phase_times_s;
  j["peaks"] = write_array(r.peaks, write_peak);
  j["losses"] = write_losses(r.losses);
  if (!r.loss_scales.empty()) j["loss_scales"] = r.loss_scales;
  if (!r.loss_scales.empty() || !r.skipped_steps.empty()) j["skipped_steps"] = r.skipped_steps;
  j["units"] = write_array(r.units, write_unit_phase_time);
  if (!r.lr_gains.empty()) j["lr_gains"] = r.lr_gains;
  j["fallbacks"] = r.fallbacks;
  j["trace_paths"] = r.trace_paths;
  if (!r.stages.empty()) j["stages"] = write_array(r.stages, write_run_stage);
  if (!r.stages.empty() || r.bubble_fraction != 0) j["bubble_fraction"] = r.bubble_fraction;
  if (!r.offloaded_activations.empty()) j["offloaded_activations"] = write_array(r.offloaded_activations, write_offloaded);
  j["plan"] = to_ordered_json(r.plan);
  return j;
}

void validate(const RunRecord& r) {
  validate(r.plan);
  if (r.model.empty()) record_error("model is empty");
  const RunEnvironment& e = r.environment;
  if (e.backend != "gloo" && e.backend != "nccl" && e.backend != "shm")
    record_error("environment.backend must be \"gloo\", \"shm\" or \"nccl\" (got " + quote_json(e.backend) + ")");
  if (e.cores < 0) record_error("environment.cores must be >= 0 (got " + num(e.cores) + ")");
  if (!(e.other_load_cores >= 0 || e.other_load_cores == -1))
    record_error("environment.other_load_cores must be >= 0, or -1 when unknown (got " + num(e.other_load_cores) + ")");
  if (e.threads_per_rank < 1)
    record_error("environment.threads_per_rank must be >= 1 (got " + num(e.threads_per_rank) + ")");
  if (e.ranks != r.plan.world_size)
    record_error("environment.ranks " + num(e.ranks) + " != plan.world_size " + num(r.plan.world_size));
  const int steps = static_cast<int>(r.step_times_s.size());
  if (r.warmup_steps < 0 || r.warmup_steps >= steps)
    record_error("warmup_steps " + num(r.warmup_steps) + " leaves no measured step of " + num(steps));
  for (std::size_t i = 0; i < r.step_times_s.size(); ++i)
    if (!(r.step_times_s[i] > 0))
      record_error("step_times_s[" + std::to_string(i) + "] must be > 0 (got " + num(r.step_times_s[i]) + ")");
  if (!(r.step_time_p10_s <= r.step_time_median_s && r.step_time_median_s <= r.step_time_p90_s))
    record_error("step times: p10 " + num(r.step_time_p10_s) + " <= median " + num(r.step_time_median_s) +
                 " <= p90 " + num(r.step_time_p90_s) + " does not hold");
  for (const auto& [phase, s] : r.phase_times_s)
    if (!(s >= 0)) record_error("phase_times_s." + phase + " must be >= 0 (got " + num(s) + ")");
  if (static_cast<int>(r.peaks.size()) != e.ranks)
    record_error("peaks has " + num(static_cast<std::int64_t>(r.peaks.size())) + " entries for " + num(e.ranks) +
                 " ranks");
  for (std::size_t i = 0; i < r.peaks.size(); ++i) {
    const RankPeak& p = r.peaks[i];
    if (p.rank != static_cast<int>(i))
      record_error("peaks[" + std::to_string(i) + "].rank is " + num(p.rank) + " (expected " + std::to_string(i) + ")");
    if (p.device_peak_bytes < 0 || p.host_peak_bytes < 0 || p.host_reserved_bytes < 0)
      record_error("peaks[" + std::to_string(i) + "]: negative bytes (device " + num(p.device_peak_bytes) +
                   ", host " + num(p.host_peak_bytes) + ", host reserved " + num(p.host_reserved_bytes) + ")");
  }
  if (!r.stages.empty() && static_cast<int>(r.stages.size()) != r.plan.pipeline_stages)
    record_error("stages has " + num(static_cast<std::int64_t>(r.stages.size())) + " entries for plan.pipeline_stages " +
                 num(r.plan.pipeline_stages));
  for (std::size_t i = 0; i < r.stages.size(); ++i) {
    const RunStage& st = r.stages[i];
    const std::string at = "stages[" + std::to_string(i) + "]";
    if (st.stage != static_cast<int>(i)) record_error(at + ".stage is " + num(st.stage) + " (expected " + std::to_string(i) + ")");
    if (st.first_unit < 0 || st.units < 1)
      record_error(at + ": first_unit " + num(st.first_unit) + " must be >= 0 and units " + num(st.units) + " >= 1");
    if (st.device_peak_bytes < 0 || st.host_peak_bytes < 0 || !(st.compute_busy_s >= 0))
      record_error(at + ": negative figure (device " + num(st.device_peak_bytes) + ", host " + num(st.host_peak_bytes) +
                   ", compute_busy_s " + num(st.compute_busy_s) + ")");
    for (const int rank : st.ranks)
      if (rank < 0 || rank >= e.ranks) record_error(at + ".ranks has rank " + num(rank) + " of " + num(e.ranks));
  }
  for (std::size_t i = 0; i < r.offloaded_activations.size(); ++i) {
    const OffloadedActivations& o = r.offloaded_activations[i];
    if (o.offloaded < 0 || o.offloaded > o.tensors || o.offloaded_bytes < 0 || o.offloaded_bytes > o.bytes)
      record_error("offloaded_activations[" + std::to_string(i) + "] (" + o.name + "): offloaded " + num(o.offloaded) +
                   " of " + num(o.tensors) + " tensors, " + num(o.offloaded_bytes) + " of " + num(o.bytes) +
                   " bytes: the offloaded part must be within [0, all]");
  }
  if (!(r.bubble_fraction >= 0 && r.bubble_fraction <= 1))
    record_error("bubble_fraction must be in [0, 1] (got " + num(r.bubble_fraction) + ")");
  if (static_cast<int>(r.lr_gains.size()) > steps)
    record_error("lr_gains has " + num(static_cast<std::int64_t>(r.lr_gains.size())) + " entries for " + num(steps) +
                 " steps");
  if (static_cast<int>(r.losses.size()) > steps)
    record_error("losses has " + num(static_cast<std::int64_t>(r.losses.size())) + " entries for " + num(steps) +
                 " steps");
  if (static_cast<int>(r.loss_scales.size()) > steps)
    record_error("loss_scales has " + num(static_cast<std::int64_t>(r.loss_scales.size())) + " entries for " +
                 num(steps) + " steps");
  for (std::size_t i = 0; i < r.loss_scales.size(); ++i)
    if (!(r.loss_scales[i] > 0))
      record_error("loss_scales[" + std::to_string(i) + "] must be > 0 (got " + num(r.loss_scales[i]) + ")");
  for (int s : r.skipped_steps)
    if (s < 0 || s >= steps) record_error("skipped_steps has step " + num(s) + " of " + num(steps) + " steps");
  if (!r.trace_paths.empty() && static_cast<int>(r.trace_paths.size()) != e.ranks)
    record_error("trace_paths has " + num(static_cast<std::int64_t>(r.trace_paths.size())) + " entries for " +
                 num(e.ranks) + " ranks");
  for (std::size_t i = 0; i < r.units.size(); ++i)
    if (!(r.units[i].fwd_s >= 0 && r.units[i].bwd_s >= 0))
      record_error("units[" + std::to_string(i) + "]: negative time (fwd_s " + num(r.units[i].fwd_s) + ", bwd_s " +
                   num(r.units[i].bwd_s) + ")");
}

void to_json(nlohmann::json& j, const RunRecord& r) { j = to_plain(to_ordered_json(r)); }
void to_json(nlohmann::json& j, const OffloadedActivations& o) { j = to_plain(write_offloaded(o)); }
void from_json(const nlohmann::json& j, OffloadedActivations& o) { read_value(j, o, "offloaded_activations[]"); }

void from_json(const nlohmann::json& j, RunRecord& rec) {
  ObjectReader r(j, kRunRecordWhere);
  check_schema(r, kRunRecordSchema);
  rec = RunRecord{};
  r.req("model", rec.model);
  r.req("environment", rec.environment);
  r.req("warmup_steps", rec.warmup_steps);
  r.req("step_times_s", rec.step_times_s);
  r.req("step_time_median_s", rec.step_time_median_s);
  r.req("step_time_p10_s", rec.step_time_p10_s);
  r.req("step_time_p90_s", rec.step_time_p90_s);
  r.opt("phase_times_s", rec.phase_times_s);
  r.req("peaks", rec.peaks);
  Losses losses{&rec.losses};
  r.opt("losses", losses);
  r.opt("loss_scales", rec.loss_scales);
  r.opt("skipped_steps", rec.skipped_steps);
  r.opt("units", rec.units);
  r.opt("lr_gains", rec.lr_gains);
  r.opt("fallbacks", rec.fallbacks);
  r.opt("trace_paths", rec.trace_paths);
  r.opt("stages", rec.stages);
  r.opt("bubble_fraction", rec.bubble_fraction);
  r.opt("offloaded_activations", rec.offloaded_activations);
  r.req("plan", rec.plan);
  r.finish();
  validate(rec);
}

}  // namespace zeroplan
