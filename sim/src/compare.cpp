// Predicted vs measured (see compare.h for the metrics and the phase mapping).
#include "zeroplan/sim/compare.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/trace.h"

namespace zeroplan::sim {

namespace {

using ojson = nlohmann::ordered_json;

// Collective phases the executor records (one per c10d call it issues).
const std::set<std::string>& collective_phases() {
  static const std::set<std::string> names{"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                           "reduce", "all_to_all", "barrier"};
  return names;
}

double value_or_zero(const std::map<std::string, double>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? 0.0 : it->second;
}

// Units run this many times per step; the Prediction's unit timings are of the first.
int chunks_per_step(const Plan& plan) {
  return plan.offload_model.enabled ? plan.offload_model.microbatches : plan.microbatches;
}

std::string ms(double s) { return fmt::format("{:.3f} ms", s * 1e3); }
std::string mib(double bytes) { return fmt::format("{:.1f} MiB", bytes / double(1 << 20)); }

// ---- phases ------------------------------------------------------------------------------------

void add_phases(const Prediction& p, const RunRecord& r, const CompareOptions& o, std::vector<Metric>& out) {
  const auto& measured = r.phase_times_s;
  if (measured.empty()) return;
  auto add = [&](const std::string& phase, double predicted, double meas) {
    out.push_back(make_metric("phase." + phase + "_s", predicted, meas, o.gate_phases));
  };
  const int chunks = chunks_per_step(p.plan);
  if (!p.units.empty()) {
    double fwd = 0, bwd = 0;
    for (const UnitTiming& u : p.units) {
      fwd += u.fwd_s;
      bwd += u.bwd_s;
    }
    if (measured.count("forward")) add("forward", fwd * chunks, measured.at("forward"));
    if (measured.count("backward")) add("backward", bwd * chunks, measured.at("backward"));
  }
  if (p.resource_busy_s.empty()) return;
  const bool host_opt = r.plan.optimizer_on_host();
  double compute = value_or_zero(measured, "forward") + value_or_zero(measured, "backward") +
                   value_or_zero(measured, "recompute") + value_or_zero(measured, "cast") +
                   value_or_zero(measured, "zero_grad");
  if (!host_opt) compute += value_or_zero(measured, "optimizer");
  const auto& busy = p.resource_busy_s;
  auto either = [&](const std::string& phase, double predicted, double meas) {
    if (predicted > 0 || meas > 0) add(phase, predicted, meas);
  };
  either("compute", value_or_zero(busy, "compute"), compute);
  if (host_opt || busy.count("host_optimizer"))
    either("optimizer", value_or_zero(busy, "host_optimizer"), host_opt ? value_or_zero(measured, "optimizer") : 0.0);
  // Activation offload's copies run on the executor's side lane, recorded in the phases d2h and h2d by
  // direction. Runs measured before 2026-11-29 recorded them as one phase `side_lane` for both directions
  // (the documents under profiles/data/measured): there the copies are compared together.
  if (const double side = value_or_zero(measured, "side_lane"); side > 0) {
    either("copies", value_or_zero(busy, "h2d") + value_or_zero(busy, "d2h"),
           value_or_zero(measured, "h2d") + value_or_zero(measured, "d2h") + side);
  } else {
    either("h2d", value_or_zero(busy, "h2d"), value_or_zero(measured, "h2d"));
    either("d2h", value_or_zero(busy, "d2h"), value_or_zero(measured, "d2h"));
  }
  double comm_pred = 0, comm_meas = 0;
  for (const auto& [name, s] : busy)
    if (name == "comm" || name.rfind("comm.", 0) == 0) comm_pred += s;
  for (const auto& [name, s] : measured)
    if (collective_phases().count(name)) comm_meas += s;
  either("comm", comm_pred, comm_meas);
  if (measured.count("comm_wait") || p.exposed_comm_s > 0)
    add("exposed_comm", p.exposed_comm_s, value_or_zero(measured, "comm_wait"));
}

// ---- warnings ----------------------------------------------------------------------------------

// "a.b.c" -> scalar (dumped), for a field-by-field plan diff.
void flatten(const nlohmann::json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else {
    out[prefix] = j.dump();
  }
}

void check_plans(const Plan& predicted, const Plan& measured, std::vector<std::string>& warnings) {
  std::map<std::string, std::string> a, b;
  flatten(nlohmann::json(predicted), "", a);
  flatten(nlohmann::json(measured), "", b);
  std::set<std::string> keys;
  for (const auto& [k, v] : a) keys.insert(k);
  for (const auto& [k, v] : b) keys.insert(k);
  std::vector<std::string> diffs;
  for (const std::string& k : keys) {
    if (k == "seed") continue;  // does not change time or memory
    auto ia = a.find(k), ib = b.find(k);
    const std::string va = ia == a.end() ? "(none)" : ia->second;
    const std::string vb = ib == b.end() ? "(none)" : ib->second;
    if (va != vb) diffs.push_back(fmt::format("{} {} vs {}", k, va, vb));
  }
  if (diffs.empty()) return;
  warnings.push_back(fmt::format("the prediction and the run are of different plans (predicted vs measured): {}",
                                 fmt::join(diffs, ", ")));
}

bool is_cpu(const std::string& device) { return device == "cpu" || device.rfind("cpu:", 0) == 0; }

void check_profile(const ModelProfile& m, const Prediction& p, const RunRecord& r, std::vector<std::string>& w) {
  const RunEnvironment& env = r.environment;
  if (m.name != p.model)
    w.push_back(fmt::format("the ModelProfile is of \"{}\" but the prediction is of \"{}\"", m.name, p.model));
  if (m.measured && m.threads != env.threads_per_rank)
    w.push_back(fmt::format("threads per rank differ: the profile was measured with {} threads, the run used {}; "
                            "unit times do not transfer",
                            m.threads, env.threads_per_rank));
  if (m.measured) {
    const Plan& plan = r.plan;
    const int batch = plan.offload_model.enabled ? plan.micro_batch / std::max(1, plan.offload_model.microbatches)
                                                 : plan.micro_batch;
    int lo = m.batch, hi = m.batch;
    for (int b : m.profiled_batches) {
      lo = std::min(lo, b);
      hi = std::max(hi, b);
    }
    if (batch < lo || batch > hi) {
      if (m.profiled_batches.empty())
        w.push_back(fmt::format("micro batch {} differs from the profile's batch {} and the profile has no fitted "
                                "range: its figures are extrapolated",
                                batch, m.batch));
      else
        w.push_back(fmt::format("micro batch {} is outside the profiled range [{}, {}]: the profile's figures are "
                                "extrapolated",
                                batch, lo, hi));
    }
  }
  auto version = [&](const char* lib, const std::string& run_version) {
    auto it = m.library_versions.find(lib);
    if (it == m.library_versions.end() || it->second.empty() || run_version.empty() || it->second == run_version) return;
    w.push_back(fmt::format("{} versions differ: the profile was measured with {}, the run used {}", lib, it->second,
                            run_version));
  };
  version("torch", env.torch_version);
  version("zeroplan", env.zeroplan_version);
  if (!m.device.empty() && !env.device.empty() && is_cpu(m.device) != is_cpu(env.device))
    w.push_back(fmt::format("the profile was measured on \"{}\" but the run ran on \"{}\"", m.device, env.device));
}

std::vector<std::string> warnings_for(const Prediction& p, const RunRecord& r, const CompareOptions& o) {
  std::vector<std::string> w;
  if (p.model != r.model)
    w.push_back(fmt::format("the prediction is of model \"{}\" but the run of \"{}\"", p.model, r.model));
  // A pipeline balanced by time or memory ran as the units per stage it resolved to (the run records
  // them): the same plan when they are the prediction's stages.
  Plan predicted = p.plan;
  if (predicted.pipeline.balance.mode != PipelineBalance::Mode::units &&
      r.plan.pipeline.balance.mode == PipelineBalance::Mode::units && !p.stages.empty()) {
    std::vector<int> resolved;
    for (const StagePrediction& st : p.stages) resolved.push_back(st.units);
    if (resolved == r.plan.pipeline.balance.units) predicted.pipeline.balance = r.plan.pipeline.balance;
  }
  check_plans(predicted, r.plan, w);
  if (o.model != nullptr) {
    check_profile(*o.model, p, r, w);
  } else {
    w.push_back("no ModelProfile given: threads per rank, fitted batch range and library versions were not checked");
  }
  if (!o.zeroplan_version.empty() && !r.environment.zeroplan_version.empty() &&
      o.zeroplan_version != r.environment.zeroplan_version)
    w.push_back(fmt::format("the run was recorded by zeroplan {}, this is zeroplan {}", r.environment.zeroplan_version,
                            o.zeroplan_version));
  if (!r.fallbacks.empty())
    w.push_back(fmt::format("the run used fallbacks the simulation may not model: {}", fmt::join(r.fallbacks, "; ")));
  const std::size_t steps = r.measured_step_times_s().size();
  if (steps < 3) w.push_back(fmt::format("only {} measured step{}: the median is noisy", steps, steps == 1 ? "" : "s"));
  if (r.step_time_median_s > 0) {
    const double spread = (r.step_time_p90_s - r.step_time_p10_s) / r.step_time_median_s;
    if (spread > o.time_tolerance)
      w.push_back(fmt::format("measured step times spread {:.1f}% (p10 {} to p90 {}), more than the time tolerance "
                              "{:.1f}%: the machine was not quiet",
                              100 * spread, ms(r.step_time_p10_s), ms(r.step_time_p90_s), 100 * o.time_tolerance));
  }
  // The input pipeline is not simulated: a step that waited for its data over a twentieth of its time is
  // slower than predicted for that reason alone.
  if (const auto data = r.phase_times_s.find("data");
      data != r.phase_times_s.end() && r.step_time_median_s > 0 && data->second > 0.05 * r.step_time_median_s)
    w.push_back(fmt::format("the run waited {} per step for its data ({:.0f}% of the step): the input pipeline, which "
                            "the prediction does not model, made the step slower",
                            ms(data->second), 100 * data->second / r.step_time_median_s));
  if (!p.fits())
    w.push_back("the prediction says the plan does not fit in memory, yet it ran: check the cluster's capacities");
  if (!r.units.empty()) {
    // Units are matched by name: say which did not match, on both sides (at most 3 names each).
    std::set<std::string> predicted, measured;
    for (const UnitTiming& u : p.units) predicted.insert(u.name);
    for (const UnitPhaseTime& u : r.units) measured.insert(u.name);
    auto some = [](const std::vector<std::string>& names) {
      std::vector<std::string> q;
      for (std::size_t i = 0; i < names.size() && i < 3; ++i) q.push_back("\"" + names[i] + "\"");
      return fmt::format("{}{}", fmt::join(q, ", "), names.size() > 3 ? ", ..." : "");
    };
    std::vector<std::string> unmeasured, unpredicted;
    for (const UnitTiming& u : p.units)
      if (!measured.count(u.name)) unmeasured.push_back(u.name);
    for (const UnitPhaseTime& u : r.units)
      if (!predicted.count(u.name)) unpredicted.push_back(u.name);
    if (!unmeasured.empty())
      w.push_back(fmt::format("{} of the prediction's {} units have no measured unit of that name ({}): not compared{}",
                              unmeasured.size(), p.units.size(), some(unmeasured),
                              unpredicted.empty() ? "" : "; the run measured " + some(unpredicted) + " instead"));
  }
  return w;
}

// ---- largest error sources ---------------------------------------------------------------------

struct Source {
  double share;  // |error| as a share of its headline figure
  std::string line;
};

std::string direction(double err, const char* under, const char* over) { return err < 0 ? under : over; }

std::string hint(const std::string& name, double err) {
  if (name == "step_time_s")
    return err < 0 ? "the simulator is optimistic about the whole step" : "the simulator is pessimistic about the whole step";
  if (name == "phase.forward_s" || name == "phase.backward_s" || name == "phase.compute_s")
    return "compute runs " + direction(err, "slower", "faster") +
           " than the ModelProfile's unit times say (re-profile with the run's threads and local ranks, "
           "profile --concurrent-ranks; on a shared CPU check the probe's core_contention)";
  if (name == "phase.comm_s")
    return "collectives run " + direction(err, "slower", "faster") +
           " than the ClusterProfile's alpha-beta fit (re-probe the collectives at this world size)";
  if (name == "phase.exposed_comm_s")
    return direction(err, "more", "less") + " communication is left exposed than simulated (overlap with compute)";
  if (name == "phase.optimizer_s")
    return "the host optimizer runs " + direction(err, "slower", "faster") + " than the ClusterProfile's throughput";
  if (name == "phase.h2d_s" || name == "phase.d2h_s" || name == "phase.copies_s")
    return "copies run " + direction(err, "slower", "faster") + " than the ClusterProfile's bandwidth";
  if (name.rfind("host_reserved_bytes", 0) == 0)
    return err < 0 ? "the host allocator holds more than the simulated pinned blocks (blocks the simulator does not place)"
                   : "the simulator rounds or keeps more pinned blocks than the host allocator held";
  if (name.rfind("device_peak_bytes", 0) == 0 || name.rfind("host_peak_bytes", 0) == 0)
    return err < 0 ? "memory the simulator does not model (allocator, workspaces, temporaries)"
                   : "the simulator keeps more memory, or keeps it longer, than the executor";
  return "";
}

bool is_memory(const std::string& name) {
  return name.rfind("device_peak_bytes", 0) == 0 || name.rfind("host_peak_bytes", 0) == 0 ||
         name.rfind("host_reserved_bytes", 0) == 0;
}

std::vector<std::string> largest_sources(const Comparison& c, double measured_step_s, int chunks, int max_sources) {
  std::vector<Source> sources;
  auto pct = [](double x) { return fmt::format("{:+.1f}%", 100 * x); };
  // Memory: the rank with the largest error of each pool.
  std::map<std::string, const Metric*> worst_pool;
  for (const Metric& m : c.metrics) {
    if (is_memory(m.name)) {
      if (!m.gating) continue;
      const std::string pool = m.name.substr(0, m.name.find('.'));
      const Metric*& w = worst_pool[pool];
      if (w == nullptr || std::fabs(m.rel_error) > std::fabs(w->rel_error)) w = &m;
      continue;
    }
    const double share = measured_step_s > 0 ? std::fabs(m.predicted - m.measured) / measured_step_s : 0.0;
    sources.push_back({share, fmt::format("{}: predicted {}, measured {} ({}, {:.1f}% of the measured step): {}", m.name,
                                          ms(m.predicted), ms(m.measured), pct(m.rel_error), 100 * share,
                                          hint(m.name, m.rel_error))});
  }
  for (const auto& [pool, m] : worst_pool) {
    const double share = std::fabs(m->rel_error);
    sources.push_back({share, fmt::format("{}: predicted {}, measured {} ({}): {}", m->name, mib(m->predicted),
                                          mib(m->measured), pct(m->rel_error), hint(m->name, m->rel_error))});
  }
  for (const UnitComparison& u : c.units) {
    for (const Metric& m : u.metrics) {
      const double share = measured_step_s > 0 ? std::fabs(m.predicted - m.measured) * chunks / measured_step_s : 0.0;
      const bool fwd = m.name == "fwd_s";
      sources.push_back({share, fmt::format("unit {} {}: predicted {}, measured {} ({}, {:.1f}% of the measured step): "
                                            "its {} runs {} than profiled",
                                            u.name, m.name, ms(m.predicted), ms(m.measured), pct(m.rel_error),
                                            100 * share, fwd ? "forward" : "backward",
                                            direction(m.rel_error, "slower", "faster"))});
    }
  }
  std::stable_sort(sources.begin(), sources.end(), [](const Source& a, const Source& b) { return a.share > b.share; });
  std::vector<std::string> out;
  for (const Source& s : sources) {
    if (static_cast<int>(out.size()) >= max_sources || !(s.share >= 1e-3)) break;
    out.push_back(s.line);
  }
  return out;
}

}  // namespace

Comparison compare(const Prediction& p, const RunRecord& r, const CompareOptions& o) {
  if (!(o.time_tolerance > 0))
    throw SchemaError(fmt::format("compare: time tolerance must be > 0 (got {})", o.time_tolerance));
  if (!(o.memory_tolerance > 0))
    throw SchemaError(fmt::format("compare: memory tolerance must be > 0 (got {})", o.memory_tolerance));
  Comparison c;
  c.tolerance = o.time_tolerance;

  double measured_step_s = r.step_time_median_s;
  if (r.plan.localsgd()) {
    // The mean over the LocalSGD period, after the localsgd warm-up's plain DDP steps (which step_time_s
    // leaves out) when some measured steps follow them.
    std::vector<double> steps = r.measured_step_times_s();
    const auto warm = static_cast<std::size_t>(std::max(0, r.plan.localsgd_warmup_steps - r.warmup_steps));
    if (warm < steps.size()) steps.erase(steps.begin(), steps.begin() + static_cast<std::ptrdiff_t>(warm));
    double sum = 0;
    for (double s : steps) sum += s;
    if (!steps.empty()) measured_step_s = sum / static_cast<double>(steps.size());
  }
  c.metrics.push_back(make_metric("step_time_s", p.step_time_s, measured_step_s));
  add_phases(p, r, o, c.metrics);
  // Pipelined plans: each rank against its own stage's prediction (ranks are stage-major: rank / dp).
  const bool staged = r.plan.pipeline_stages > 1 && static_cast<int>(p.stages.size()) == r.plan.pipeline_stages;
  const int dp = std::max(1, r.plan.data_parallel_size());
  for (const char* pool : {"device", "host"}) {
    const bool device = pool[0] == 'd';
    for (const RankPeak& peak : r.peaks) {
      std::int64_t predicted = device ? p.device.peak_bytes : p.host.peak_bytes;
      if (staged) {
        const StagePrediction& st = p.stages[static_cast<std::size_t>(std::min(peak.rank / dp, r.plan.pipeline_stages - 1))];
        predicted = device ? st.device.peak_bytes : st.host_peak_bytes;
      }
      const std::int64_t measured = device ? peak.device_peak_bytes : peak.host_peak_bytes;
      const bool gating = predicted >= o.memory_floor_bytes || measured >= o.memory_floor_bytes;
      Metric m = make_metric(fmt::format("{}_peak_bytes.rank{}", pool, peak.rank), static_cast<double>(predicted),
                             static_cast<double>(measured), gating);
      m.tolerance = o.memory_tolerance;
      c.metrics.push_back(std::move(m));
    }
  }
  // What the host allocator holds (pinned blocks rounded to powers of two and cached, host_allocator.h)
  // against the simulated host total (peak + allocator overhead), where either side rounds: a prediction
  // for a GPU cluster or a run on CUDA. Not per stage: stage predictions carry no host overhead.
  if (!staged && (p.host.allocator_overhead_bytes > 0 || r.environment.device.rfind("cuda", 0) == 0)) {
    for (const RankPeak& peak : r.peaks) {
      if (peak.host_reserved_bytes <= 0) continue;
      const std::int64_t predicted = p.host.total_bytes();
      const bool gating = predicted >= o.memory_floor_bytes || peak.host_reserved_bytes >= o.memory_floor_bytes;
      Metric m = make_metric(fmt::format("host_reserved_bytes.rank{}", peak.rank), static_cast<double>(predicted),
                             static_cast<double>(peak.host_reserved_bytes), gating);
      m.tolerance = o.memory_tolerance;
      c.metrics.push_back(std::move(m));
    }
  }

  std::map<std::string, const UnitPhaseTime*> measured_units;
  for (const UnitPhaseTime& u : r.units) measured_units.emplace(u.name, &u);
  for (const UnitTiming& u : p.units) {
    auto it = measured_units.find(u.name);
    if (it == measured_units.end()) continue;
    c.units.push_back({u.name, {make_metric("fwd_s", u.fwd_s, it->second->fwd_s, false),
                                make_metric("bwd_s", u.bwd_s, it->second->bwd_s, false)}});
  }

  if (o.noise_floor) {
    NoiseFloor n;
    n.step_time_p10_s = r.step_time_p10_s;
    n.step_time_p90_s = r.step_time_p90_s;
    n.other_load_cores = std::max(0.0, r.environment.other_load_cores);
    n.cores = r.environment.cores;
    n.busy_load_cores = o.busy_load_cores > 0 ? o.busy_load_cores : std::max(0.25, 0.1 * n.cores);
    c.noise = n;
  }
  c.verdict = verdict_for(c.metrics, c.tolerance, c.noise ? &*c.noise : nullptr);
  c.largest_error_sources = largest_sources(c, measured_step_s, chunks_per_step(p.plan), o.max_error_sources);
  c.warnings = warnings_for(p, r, o);
  return c;
}

}  // namespace zeroplan::sim
