// The RunRecord of a run from its ranks' results (merge_results), and a rank's result as JSON (the
// launcher collects them from the rank processes).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "strformat.h"
#include "zeroplan/config.h"
#include "zeroplan/exec/run.h"

namespace zeroplan::exec {
namespace {

using Ranks = std::vector<const RunResult*>;

// Where the run ran: host, backend, device, threads, versions, and other programs' load.
void merge_environment(const Ranks& ranks, RunRecord& rec) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  rec.environment.hostname = host;
  rec.environment.backend = ranks[0]->backend == "local" ? "gloo" : ranks[0]->backend;
  rec.environment.device = ranks[0]->device;
  // The ranks' own thread counts (the launcher's would say nothing about them); the largest if they differ.
  rec.environment.threads_per_rank = 1;
  for (const RunResult* r : ranks) rec.environment.threads_per_rank = std::max(rec.environment.threads_per_rank, r->threads);
  rec.environment.torch_version = ZEROPLAN_TORCH_VERSION;
  rec.environment.zeroplan_version = ZEROPLAN_VERSION;
  rec.environment.ranks = static_cast<int>(ranks.size());
  // Other programs' load: the machine's busy CPU over the measured steps (rank 0's window) less what the
  // ranks themselves used, in cores. Ranks on other machines (torchrun across nodes) are not on this
  // one: then it is not known.
  rec.environment.cores = ranks[0]->cores;
  const bool one_host = std::all_of(ranks.begin(), ranks.end(), [&](const RunResult* r) {
    return r->cpu_own_s >= 0 && r->host == ranks[0]->host;
  });
  if (one_host && ranks[0]->cpu_machine_busy_s >= 0 && ranks[0]->cpu_wall_s > 0) {
    double own_cores = 0;
    for (const RunResult* r : ranks) own_cores += r->cpu_wall_s > 0 ? r->cpu_own_s / r->cpu_wall_s : 0;
    rec.environment.other_load_cores = std::max(0.0, ranks[0]->cpu_machine_busy_s / ranks[0]->cpu_wall_s - own_cores);
  }
}

// Each step's time is its slowest rank's; each phase's figure the median over the measured steps of the
// slowest rank's.
void merge_times(const RunOptions& options, const Ranks& ranks, std::size_t steps, RunRecord& rec) {
  std::vector<std::map<std::string, double>> phases(steps);
  for (std::size_t s = 0; s < steps; ++s) {
    double t = 0;
    for (const RunResult* r : ranks) {
      t = std::max(t, r->step_times_s[s]);
      if (s < r->phase_times_s.size()) {
        for (const auto& [k, v] : r->phase_times_s[s]) phases[s][k] = std::max(phases[s][k], v);
      }
    }
    rec.step_times_s.push_back(t);
  }
  std::set<std::string> names;
  for (const auto& p : phases) for (const auto& [k, v] : p) names.insert(k);
  for (const auto& name : names) {
    std::vector<double> values;
    for (std::size_t s = static_cast<std::size_t>(options.warmup_steps); s < steps; ++s) {
      auto it = phases[s].find(name);
      values.push_back(it == phases[s].end() ? 0.0 : it->second);
    }
    if (!values.empty()) rec.phase_times_s[name] = percentile(values, 50);
  }
}

// Unit `name`'s times: each figure the largest over the ranks that measured the unit.
UnitPhaseTime merged_unit(const std::string& name, const Ranks& ranks) {
  UnitPhaseTime u{name, 0.0, 0.0};
  for (const RunResult* r : ranks) {
    for (const UnitPhaseTime& x : r->units) {
      if (x.name != name) continue;
      u.fwd_s = std::max(u.fwd_s, x.fwd_s);
      u.bwd_s = std::max(u.bwd_s, x.bwd_s);
    }
  }
  return u;
}

// Units in rank 0's order, then those each rank ran that rank 0 did not (pipeline stages), in rank order:
// stage-major ranks, so model order.
void merge_units(const Ranks& ranks, RunRecord& rec) {
  for (const RunResult* r : ranks) {
    for (const UnitPhaseTime& x : r->units) {
      if (std::any_of(rec.units.begin(), rec.units.end(), [&](const UnitPhaseTime& u) { return u.name == x.name; })) continue;
      rec.units.push_back(merged_unit(x.name, ranks));
    }
  }
}

// Pipeline stages: each stage's largest peaks over its ranks, its median compute per step, and the
// bubble over every rank's measured steps.
void merge_stages(const RunOptions& options, const Ranks& ranks, RunRecord& rec) {
  double busy = 0, span = 0;
  rec.stages.resize(static_cast<std::size_t>(options.plan.pipeline_stages));
  for (std::size_t s = 0; s < rec.stages.size(); ++s) rec.stages[s].stage = static_cast<int>(s);
  for (const RunResult* r : ranks) {
    if (r->pipeline_stage < 0 || r->pipeline_stage >= options.plan.pipeline_stages) continue;
    RunStage& st = rec.stages[static_cast<std::size_t>(r->pipeline_stage)];
    st.first_unit = r->first_unit;
    st.units = r->stage_units;
    st.ranks.push_back(r->rank);
    st.device_peak_bytes = std::max(st.device_peak_bytes, r->device_peak_bytes);
    st.host_peak_bytes = std::max(st.host_peak_bytes, r->host_peak_bytes);
    if (!r->pipeline_busy_s.empty()) st.compute_busy_s = std::max(st.compute_busy_s, percentile(r->pipeline_busy_s, 50));
    for (std::size_t k = 0; k < r->pipeline_busy_s.size() && k < r->pipeline_span_s.size(); ++k) {
      busy += r->pipeline_busy_s[k];
      span += r->pipeline_span_s[k];
    }
  }
  rec.bubble_fraction = span > 0 ? std::clamp(1 - busy / span, 0.0, 1.0) : 0.0;
}

// Activation offload's picks per unit, in model order (a pipeline stage's ranks report its units).
void merge_offloaded(const Ranks& ranks, RunRecord& rec) {
  for (const RunResult* r : ranks) {
    for (const OffloadedActivations& o : r->offloaded_activations) {
      if (std::none_of(rec.offloaded_activations.begin(), rec.offloaded_activations.end(),
                       [&](const OffloadedActivations& x) { return x.unit == o.unit; }))
        rec.offloaded_activations.push_back(o);
    }
  }
  std::sort(rec.offloaded_activations.begin(), rec.offloaded_activations.end(),
            [](const OffloadedActivations& a, const OffloadedActivations& b) { return a.unit < b.unit; });
}

nlohmann::json units_json(const std::vector<UnitPhaseTime>& units) {
  nlohmann::json a = nlohmann::json::array();
  for (const UnitPhaseTime& u : units) a.push_back({{"name", u.name}, {"fwd_s", u.fwd_s}, {"bwd_s", u.bwd_s}});
  return a;
}

}  // namespace

RunRecord merge_results(const RunOptions& options, const std::vector<RunResult>& ranks_in) {
  if (ranks_in.empty()) throw ExecError("no rank results to merge");
  Ranks ranks;
  for (const auto& r : ranks_in) ranks.push_back(&r);
  std::sort(ranks.begin(), ranks.end(), [](const RunResult* a, const RunResult* b) { return a->rank < b->rank; });
  const std::size_t steps = ranks[0]->step_times_s.size();
  for (const RunResult* r : ranks) {
    if (r->step_times_s.size() != steps) {
      throw ExecError(detail::format("rank {} ran {} steps, rank {} ran {}", r->rank, r->step_times_s.size(),
                                  ranks[0]->rank, steps));
    }
  }
  RunRecord rec;
  // A TorchScript model by its file's name (as `profile` names it: compare matches them on it).
  rec.model = !options.torchscript.empty() ? std::filesystem::path(options.torchscript).filename().string()
              : options.preset.empty()      ? options.model
                                            : options.preset;
  rec.plan = options.plan;
  merge_environment(ranks, rec);
  rec.warmup_steps = options.warmup_steps;
  merge_times(options, ranks, steps, rec);
  merge_units(ranks, rec);
  for (const RunResult* r : ranks)
    rec.peaks.push_back({r->rank, r->device_peak_bytes, r->host_peak_bytes, r->device_peak_at, r->host_reserved_bytes});
  if (options.plan.pipeline_stages > 1) merge_stages(options, ranks, rec);
  merge_offloaded(ranks, rec);
  rec.losses = ranks[0]->losses;
  rec.loss_scales = ranks[0]->loss_scales;
  rec.skipped_steps = ranks[0]->skipped_steps;
  rec.lr_gains = ranks[0]->lr_gains;
  std::set<std::string> fb;
  for (const RunResult* r : ranks) fb.insert(r->fallbacks.begin(), r->fallbacks.end());
  rec.fallbacks.assign(fb.begin(), fb.end());
  const bool traces = std::all_of(ranks.begin(), ranks.end(), [](const RunResult* r) { return !r->trace_path.empty(); });
  if (traces) for (const RunResult* r : ranks) rec.trace_paths.push_back(r->trace_path);
  rec.compute_step_statistics();
  return rec;
}

void to_json(nlohmann::json& j, const RunResult& r) {
  j = nlohmann::json{{"rank", r.rank},
                     {"backend", r.backend},
                     {"device", r.device},
                     {"threads", r.threads},
                     {"step_times_s", r.step_times_s},
                     {"phase_times_s", r.phase_times_s},
                     {"units", units_json(r.units)},
                     {"losses", r.losses},
                     {"loss_scales", r.loss_scales},
                     {"skipped_steps", r.skipped_steps},
                     {"lr_gains", r.lr_gains},
                     {"device_peak_bytes", r.device_peak_bytes},
                     {"host_peak_bytes", r.host_peak_bytes},
                     {"host_reserved_bytes", r.host_reserved_bytes},
                     {"device_peak_at", r.device_peak_at},
                     {"fallbacks", r.fallbacks},
                     {"cpu_machine_busy_s", r.cpu_machine_busy_s},
                     {"cpu_own_s", r.cpu_own_s},
                     {"cpu_wall_s", r.cpu_wall_s},
                     {"cores", r.cores},
                     {"host", r.host},
                     {"trace_path", r.trace_path},
                     {"pipeline_stage", r.pipeline_stage},
                     {"first_unit", r.first_unit},
                     {"stage_units", r.stage_units},
                     {"pipeline_busy_s", r.pipeline_busy_s},
                     {"pipeline_span_s", r.pipeline_span_s}};
  j["offloaded_activations"] = r.offloaded_activations;
}

void from_json(const nlohmann::json& j, RunResult& r) {
  j.at("rank").get_to(r.rank);
  j.at("backend").get_to(r.backend);
  j.at("device").get_to(r.device);
  if (j.contains("threads")) j.at("threads").get_to(r.threads);
  j.at("step_times_s").get_to(r.step_times_s);
  j.at("phase_times_s").get_to(r.phase_times_s);
  r.units.clear();
  if (j.contains("units")) {
    for (const auto& u : j.at("units"))
      r.units.push_back({u.at("name").get<std::string>(), u.at("fwd_s").get<double>(), u.at("bwd_s").get<double>()});
  }
  r.losses.clear();
  for (const auto& v : j.at("losses")) r.losses.push_back(v.is_null() ? std::nan("") : v.get<double>());
  if (j.contains("loss_scales")) j.at("loss_scales").get_to(r.loss_scales);
  if (j.contains("skipped_steps")) j.at("skipped_steps").get_to(r.skipped_steps);
  if (j.contains("lr_gains")) j.at("lr_gains").get_to(r.lr_gains);
  j.at("device_peak_bytes").get_to(r.device_peak_bytes);
  j.at("host_peak_bytes").get_to(r.host_peak_bytes);
  if (j.contains("host_reserved_bytes")) j.at("host_reserved_bytes").get_to(r.host_reserved_bytes);
  if (j.contains("device_peak_at")) j.at("device_peak_at").get_to(r.device_peak_at);
  j.at("fallbacks").get_to(r.fallbacks);
  if (j.contains("cpu_machine_busy_s")) j.at("cpu_machine_busy_s").get_to(r.cpu_machine_busy_s);
  if (j.contains("cpu_own_s")) j.at("cpu_own_s").get_to(r.cpu_own_s);
  if (j.contains("cpu_wall_s")) j.at("cpu_wall_s").get_to(r.cpu_wall_s);
  if (j.contains("cores")) j.at("cores").get_to(r.cores);
  if (j.contains("host")) j.at("host").get_to(r.host);
  j.at("trace_path").get_to(r.trace_path);
  if (j.contains("pipeline_stage")) j.at("pipeline_stage").get_to(r.pipeline_stage);
  if (j.contains("first_unit")) j.at("first_unit").get_to(r.first_unit);
  if (j.contains("stage_units")) j.at("stage_units").get_to(r.stage_units);
  if (j.contains("pipeline_busy_s")) j.at("pipeline_busy_s").get_to(r.pipeline_busy_s);
  if (j.contains("pipeline_span_s")) j.at("pipeline_span_s").get_to(r.pipeline_span_s);
  r.offloaded_activations.clear();
  if (j.contains("offloaded_activations")) j.at("offloaded_activations").get_to(r.offloaded_activations);
}

}  // namespace zeroplan::exec
