// tune.json: everything the tune decided, in a fixed key order, without wall times.
#include <nlohmann/json.hpp>

#include "report_common.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/tuner/exports.h"
#include "zeroplan/tuner/report.h"

namespace zeroplan::tuner {
namespace {

using ojson = nlohmann::ordered_json;

ojson plan_json(const Plan& p) { return ojson::parse(to_json_string(p)); }

ojson metrics(const Prediction& p) {
  ojson j;
  j["step_time_s"] = p.step_time_s;
  j["sync_step_time_s"] = p.sync_step_time_s;
  j["samples_per_s"] = p.samples_per_s;
  j["lower_bound_s"] = p.lower_bound_s;
  j["device_peak_bytes"] = p.device.total_bytes();
  j["device_allocator_overhead_bytes"] = p.device.allocator_overhead_bytes;
  j["host_peak_bytes"] = p.host.total_bytes();
  j["bound"] = p.bound;
  j["exposed_comm_s"] = p.exposed_comm_s;
  j["overlapped_comm_s"] = p.overlapped_comm_s;
  ojson busy = ojson::object();
  for (const auto& [k, v] : report::resource_times(p)) busy[k] = v;
  j["resource_busy_s"] = busy;
  ojson cat = ojson::object();
  for (const auto& [k, v] : report::device_by_category(p)) cat[k] = v;
  j["device_peak_by_category"] = cat;
  return j;
}

ojson ranked_json(const RankedPlan& r) {
  ojson j;
  j["candidate"] = r.candidate;
  j["metrics"] = metrics(r.prediction);
  j["plan"] = plan_json(r.plan);
  if (r.equivalents > 0) {
    j["equivalents"] = r.equivalents;
    j["equivalent_knobs"] = r.equivalent_knobs;
  }
  return j;
}

ojson constraints_json(const TuneResult& r) {
  ojson c;
  c["global_batch"] = r.constraints.global_batch;
  c["world_size"] = r.constraints.world_size;
  c["nodes"] = r.constraints.nodes;
  c["device_headroom_fraction"] = r.constraints.device_headroom_fraction;
  c["device_headroom_bytes"] = r.constraints.device_headroom_bytes;
  c["host_headroom_fraction"] = r.constraints.host_headroom_fraction;
  c["host_headroom_bytes"] = r.constraints.host_headroom_bytes;
  c["knobs"] = r.constraints.knobs;
  ojson fixed = ojson::object();
  for (const auto& [k, v] : r.constraints.fixed) fixed[k] = v;
  c["fixed"] = fixed;
  c["allow_approximate_averaging"] = r.constraints.allow_approximate_averaging;
  c["optimizer"] = r.constraints.optimizer;
  return c;
}

ojson counts_json(const TuneResult& r) {
  ojson counts;
  counts["candidates"] = r.candidates;
  counts["invalid"] = r.rejections.invalid_total();
  counts["out_of_memory_bound"] = r.rejections.out_of_memory_bound;
  counts["out_of_memory_simulated"] = r.rejections.out_of_memory;
  counts["simulator_errors"] = r.rejections.errors;
  if (r.rejections.dominated > 0) counts["dominated"] = r.rejections.dominated;
  counts["fitting"] = r.fitting;
  counts["simulations"] = r.simulations;
  counts["bound_prunes"] = r.bound_prunes;
  return counts;
}

ojson rejections_json(const TuneResult& r) {
  ojson rej;
  ojson inv = ojson::object();
  for (const auto& [k, v] : r.rejections.invalid) inv[k] = v;
  rej["invalid"] = inv;
  ojson errs = ojson::object();
  for (const auto& [k, v] : r.rejections.error_messages) errs[k] = v;
  rej["simulator_errors"] = errs;
  ojson closest = ojson::array();
  for (const Rejection& x : r.rejections.closest) {
    ojson e;
    e["candidate"] = x.candidate;
    e["status"] = std::string(to_string(x.status));
    e["device_excess_bytes"] = x.device_excess_bytes;
    e["host_excess_bytes"] = x.host_excess_bytes;
    e["plan"] = plan_json(x.plan);
    closest.push_back(e);
  }
  rej["closest"] = closest;
  return rej;
}

ojson default_json(const TuneResult& r) {
  const DefaultCheck& d = r.default_plan;
  ojson dj;
  dj["valid"] = d.valid;
  if (!d.valid) dj["invalid_reason"] = d.invalid_reason;
  dj["simulated"] = d.simulated;
  if (!d.error.empty()) dj["error"] = d.error;
  dj["fits"] = d.fits;
  dj["device_needed_bytes"] = d.device_needed_bytes;
  dj["device_available_bytes"] = d.device_available_bytes;
  dj["host_needed_bytes"] = d.host_needed_bytes;
  dj["host_available_bytes"] = d.host_available_bytes;
  if (d.simulated) dj["metrics"] = metrics(d.prediction);
  if (d.valid) dj["plan"] = plan_json(d.plan);
  return dj;
}

// The explanation: per comparison (runner-up, default) the knob steps between the plans and its lines.
ojson why_json(const TuneResult& r) {
  ojson ex = ojson::array();
  for (const PlanComparison& pc : r.explanation.comparisons) {
    ojson e;
    e["against"] = pc.against;
    e["other_fits"] = pc.other_fits;
    ojson steps = ojson::array();
    for (const KnobStep& s : pc.steps) {
      ojson st;
      st["knobs"] = s.knobs;
      st["from"] = s.from;
      st["to"] = s.to;
      st["simulated"] = s.simulated;
      if (!s.error.empty()) st["error"] = s.error;
      st["step_time_before_s"] = s.step_time_before_s;
      st["step_time_after_s"] = s.step_time_after_s;
      st["device_before_bytes"] = s.device_before_bytes;
      st["device_after_bytes"] = s.device_after_bytes;
      st["host_before_bytes"] = s.host_before_bytes;
      st["host_after_bytes"] = s.host_after_bytes;
      st["fits_after"] = s.fits_after;
      steps.push_back(st);
    }
    e["steps"] = steps;
    e["lines"] = pc.lines;
    ex.push_back(e);
  }
  return ex;
}

ojson exports_json(const TuneResult& r) {
  ojson exports = ojson::array();
  if (const RankedPlan* best = r.best()) {
    for (const Export& x : export_all(best->plan, r.model, r.nodes_used, r.cluster.devices_per_node, r.cluster.device.kind)) {
      ojson e;
      e["tool"] = x.tool;
      e["file"] = x.file;
      e["expressible"] = x.expressible();
      e["unsupported"] = x.unsupported;
      e["notes"] = x.notes;
      exports.push_back(e);
    }
  }
  return exports;
}

}  // namespace

std::string tune_json(const TuneResult& r) {
  ojson j;
  j["schema"] = kTuneSchema;
  j["model"] = r.model.name;
  j["cluster"] = r.cluster.name;
  j["constraints"] = constraints_json(r);
  j["world_size"] = r.world_size;
  j["nodes_used"] = r.nodes_used;
  j["limits"] = {{"device_bytes", r.limits.device_bytes}, {"host_bytes", r.limits.host_bytes}};
  j["notes"] = r.notes;
  j["counts"] = counts_json(r);
  j["rejections"] = rejections_json(r);
  ojson ranking = ojson::array();
  for (const RankedPlan& p : r.ranking) ranking.push_back(ranked_json(p));
  j["ranking"] = ranking;
  ojson pareto = ojson::array();
  for (const RankedPlan& p : r.pareto) {
    ojson e;
    e["candidate"] = p.candidate;
    e["device_peak_bytes"] = p.prediction.device.total_bytes();
    e["samples_per_s"] = p.prediction.samples_per_s;
    e["summary"] = report::summary(p.plan);
    pareto.push_back(e);
  }
  j["pareto"] = pareto;
  j["default"] = default_json(r);
  j["why"] = why_json(r);
  j["exports"] = exports_json(r);
  return j.dump(2) + "\n";
}

}  // namespace zeroplan::tuner
