#include "zeroplan/exec/run.h"

#include "cpu_times.h"
#include "strformat.h"
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <nlohmann/json.hpp>
#include <set>

#include "zeroplan/config.h"
#include "zeroplan/exec/device.h"
#include "zeroplan/exec/executor.h"
#include "zeroplan/exec/recorder.h"
#include "zeroplan/profiles/host_heap.h"

namespace zeroplan::exec {

std::string rank_trace_path(const std::string& path, int rank) {
  if (path.empty()) return path;
  if (auto pos = path.find("{rank}"); pos != std::string::npos) {
    return path.substr(0, pos) + std::to_string(rank) + path.substr(pos + 6);
  }
  const std::string suffix = ".json";
  if (path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return path.substr(0, path.size() - suffix.size()) + "-rank" + std::to_string(rank) + suffix;
  }
  return path + "-rank" + std::to_string(rank);
}

zoo::Model build_run_model(const RunOptions& options) {
  if (!options.torchscript.empty()) {
    return zoo::load_torchscript(options.torchscript, options.input_shape, options.plan.seed, options.script_task);
  }
  return zoo::build_model(options.model, options.preset, options.model_options, options.plan.seed);
}

RunResult run_rank(const RunOptions& options, Communicator& comm) {
  retain_freed_host_memory();  // the profiler timed the units so: a step's freed blocks kept for the next
  if (options.threads > 0) at::set_num_threads(options.threads);
  if (options.steps < 1) throw ExecError(detail::format("steps {} < 1", options.steps));
  if (options.warmup_steps < 0 || options.warmup_steps >= options.steps) {
    throw ExecError(detail::format("warmup steps {} must be in [0, steps {})", options.warmup_steps, options.steps));
  }
  std::unique_ptr<Device> device = make_device(options.device);
  RunResult result;
  result.rank = comm.rank();
  result.backend = comm.backend();
  result.device = device->name();
  result.threads = at::get_num_threads();

  zoo::Model model = build_run_model(options);
  if (device->torch_device() != torch::Device(torch::kCPU)) {
    for (auto& unit : model.units) unit.module->to(device->torch_device());
  }
  if (options.device_memory_limit_bytes > 0) device->set_limit(options.device_memory_limit_bytes);

  Recorder recorder(comm.rank(), !options.trace_path.empty());
  ExecOptions exec_options;
  exec_options.ranks_per_node = options.ranks_per_node;
  Executor executor(model, options.plan, comm, *device, recorder, exec_options);
  // A resumed run continues the training: the checkpoint's states, and its step for the data.
  const std::int64_t first_step = options.resume_dir.empty() ? 0 : executor.load_checkpoint(options.resume_dir);
  // What an interrupted save left (a step folder without its manifest) goes before this run saves.
  if (!options.checkpoint_dir.empty() && comm.rank() == 0) prune_checkpoints(options.checkpoint_dir, -1, 0);
  // The random streams the steps draw from (Dropout's masks, attention dropout) seeded from the plan's
  // seed, the rank and the step the run starts at: the same command gives the same losses on the same
  // machine, each rank its own masks (torch's default generator otherwise starts wherever the process
  // left it). A resumed run draws from its first step's stream, not where the saved run was.
  torch::manual_seed(static_cast<std::uint64_t>(options.plan.seed) * 0x9E3779B97F4A7C15ULL +
                     static_cast<std::uint64_t>(comm.rank()) * 0x100000001B3ULL + static_cast<std::uint64_t>(first_step));
  device->reset_peak();
  device->host_pool().reset_peak();
  recorder.set_peak_probe([&device] { return device->peak_bytes(); });
  recorder.set_live_probe([&device] { return device->live_bytes(); });

  std::vector<double> local_losses;
  const std::size_t n_units = model.units.size();
  std::vector<std::vector<double>> unit_fwd(n_units), unit_bwd(n_units);  // per unit: per measured step
  CpuTimes cpu_from;
  // Peaks of the training steps only: a checkpoint's save is left out of them (peaks before it kept).
  std::int64_t device_peak = 0, host_peak = 0;
  for (int s = 0; s < options.steps; ++s) {
    const bool warmup = s < options.warmup_steps;
    if (s == options.warmup_steps) cpu_from = read_cpu_times();
    recorder.begin_step(s, warmup);
    const double lane0 = device->side_lane().busy_s();
    StepStats st = executor.step(first_step + s);
    // The side lane's copies (activation offload), overlapping the phases: seconds it copied this step.
    if (const double lane = device->side_lane().busy_s() - lane0; lane > 0) st.phase_s["side_lane"] = lane;
    result.step_times_s.push_back(st.time_s);
    result.phase_times_s.push_back(std::move(st.phase_s));
    local_losses.push_back(st.loss);
    // A non-finite loss is the end of the run, not a success, unless loss scaling skipped the step as
    // designed; before the step's checkpoint, so none is written from a diverged model.
    if (!std::isfinite(st.loss) && !st.skipped) {
      throw Diverged(detail::format("the run diverged at step {}: loss {} on rank {} (lower the learning rate, or "
                                    "use loss scaling with 16-bit compute)", first_step + s, st.loss, comm.rank()));
    }
    if (options.plan.precision.loss_scale.mode != LossScale::Mode::none) result.loss_scales.push_back(st.loss_scale);
    if (st.skipped) result.skipped_steps.push_back(s);
    if (options.plan.adascale) result.lr_gains.push_back(st.lr_gain);
    if (!warmup && executor.pipeline_stage() >= 0) {
      result.pipeline_busy_s.push_back(st.pipeline_busy_s);
      result.pipeline_span_s.push_back(st.pipeline_span_s);
    }
    if (!warmup) {
      // Unit indices are this rank's (a pipeline stage's from its first unit on).
      for (const auto& [local, t] : recorder.unit_times()) {
        const int u = local + executor.first_unit();
        if (u >= static_cast<int>(n_units) || t.microbatches < 1) continue;
        unit_fwd[static_cast<std::size_t>(u)].push_back(t.fwd_s / t.microbatches);
        unit_bwd[static_cast<std::size_t>(u)].push_back(t.bwd_s / t.microbatches);
      }
    }
    if (options.progress && comm.rank() == 0) {
      std::fprintf(stderr, "step %lld (%d/%d)%s  loss %.4f (rank 0)  %.3f s\n", static_cast<long long>(first_step + s), s + 1,
                   options.steps, warmup ? " (warm-up)" : "", st.loss, st.time_s);
    }
    const bool due = options.checkpoint_every > 0 && (first_step + s + 1) % options.checkpoint_every == 0;
    if (!options.checkpoint_dir.empty() && (due || s + 1 == options.steps)) {  // and after the last step
      device_peak = std::max(device_peak, device->peak_bytes());
      host_peak = std::max(host_peak, device->host_pool().peak_bytes());
      executor.save_checkpoint(options.checkpoint_dir, first_step + s + 1);
      if (comm.rank() == 0) prune_checkpoints(options.checkpoint_dir, first_step + s + 1, options.checkpoint_keep);
      device->reset_peak();
      device->host_pool().reset_peak();
    }
  }
  const CpuTimes cpu_to = read_cpu_times();
  result.cores = cpu_to.cores;
  char host_name[256] = {0};
  gethostname(host_name, sizeof(host_name) - 1);
  result.host = host_name;
  result.cpu_wall_s = std::chrono::duration<double>(cpu_to.at - cpu_from.at).count();
  if (cpu_from.machine_busy_s >= 0 && cpu_to.machine_busy_s >= 0 && cpu_from.own_s >= 0 && cpu_to.own_s >= 0) {
    result.cpu_machine_busy_s = cpu_to.machine_busy_s - cpu_from.machine_busy_s;
    result.cpu_own_s = cpu_to.own_s - cpu_from.own_s;
  }
  for (std::size_t u = 0; u < n_units; ++u) {
    if (unit_fwd[u].empty()) continue;
    result.units.push_back({model.units[u].name, percentile(unit_fwd[u], 50), percentile(unit_bwd[u], 50)});
  }
  result.pipeline_stage = executor.pipeline_stage();
  if (result.pipeline_stage >= 0) {
    result.first_unit = executor.first_unit();
    result.stage_units = options.plan.pipeline.balance.units[static_cast<std::size_t>(result.pipeline_stage)];
  }
  result.offloaded_activations = executor.offloaded_activations();
  result.device_peak_bytes = std::max(device_peak, device->peak_bytes());
  result.host_peak_bytes = std::max(host_peak, device->host_pool().peak_bytes());
  result.host_reserved_bytes = device->host_pool().reserved_bytes();
  result.device_peak_at = recorder.peak_at();
  device->set_limit(0);

  // Global losses: one all-reduce for the whole run, outside the measured steps.
  torch::Tensor losses = torch::tensor(local_losses, torch::kFloat64);
  if (comm.world_size() > 1) {
    comm.all_reduce(losses, ReduceOp::kSum)->wait();
    losses.div_(comm.world_size());
  }
  result.losses.assign(losses.data_ptr<double>(), losses.data_ptr<double>() + losses.numel());
  result.fallbacks = comm.fallbacks();

  if (options.keep_parameters) result.parameters = executor.full_parameters();
  if (!options.trace_path.empty()) {
    result.trace_path = rank_trace_path(options.trace_path, comm.rank());
    std::ofstream out(result.trace_path);
    out << recorder.chrome_trace_json();
    if (!out) throw ExecError("cannot write trace " + result.trace_path);
  }
  return result;
}

std::string checkpoint_refusal(const RunOptions& o) {
  if (o.checkpoint_dir.empty() && o.resume_dir.empty()) return "";
  if (o.plan.localsgd()) return detail::format("localsgd_frequency {}: every rank keeps its own replica between averages", o.plan.localsgd_frequency);
  if (o.plan.adascale) return "adascale: its gain's running averages are not checkpointed";
  if (o.plan.pipeline_stages > 1)
    return detail::format("pipeline_stages {}: a pipeline stage's checkpoint is not written yet", o.plan.pipeline_stages);
  return "";
}

RunRecord merge_results(const RunOptions& options, const std::vector<RunResult>& ranks_in) {
  if (ranks_in.empty()) throw ExecError("no rank results to merge");
  std::vector<const RunResult*> ranks;
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
  rec.warmup_steps = options.warmup_steps;

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
  // Units in rank 0's order; each figure the largest over the ranks that measured the unit.
  for (const UnitPhaseTime& u0 : ranks[0]->units) {
    UnitPhaseTime u = u0;
    for (const RunResult* r : ranks) {
      for (const UnitPhaseTime& x : r->units) {
        if (x.name != u.name) continue;
        u.fwd_s = std::max(u.fwd_s, x.fwd_s);
        u.bwd_s = std::max(u.bwd_s, x.bwd_s);
      }
    }
    rec.units.push_back(std::move(u));
  }
  // Units each rank ran that rank 0 did not (pipeline stages), in rank order: stage-major ranks, so model order.
  for (const RunResult* r : ranks) {
    for (const UnitPhaseTime& x : r->units) {
      if (std::any_of(rec.units.begin(), rec.units.end(), [&](const UnitPhaseTime& u) { return u.name == x.name; })) continue;
      UnitPhaseTime u = x;
      for (const RunResult* o : ranks) {
        for (const UnitPhaseTime& y : o->units) {
          if (y.name != u.name) continue;
          u.fwd_s = std::max(u.fwd_s, y.fwd_s);
          u.bwd_s = std::max(u.bwd_s, y.bwd_s);
        }
      }
      rec.units.push_back(std::move(u));
    }
  }
  for (const RunResult* r : ranks)
    rec.peaks.push_back({r->rank, r->device_peak_bytes, r->host_peak_bytes, r->device_peak_at, r->host_reserved_bytes});
  // Pipeline stages: each stage's largest peaks over its ranks, its median compute per step, and the
  // bubble over every rank's measured steps.
  if (options.plan.pipeline_stages > 1) {
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
  for (const RunResult* r : ranks) {
    for (const OffloadedActivations& o : r->offloaded_activations) {
      if (std::none_of(rec.offloaded_activations.begin(), rec.offloaded_activations.end(),
                       [&](const OffloadedActivations& x) { return x.unit == o.unit; }))
        rec.offloaded_activations.push_back(o);
    }
  }
  std::sort(rec.offloaded_activations.begin(), rec.offloaded_activations.end(),
            [](const OffloadedActivations& a, const OffloadedActivations& b) { return a.unit < b.unit; });
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

namespace {

nlohmann::json units_json(const std::vector<UnitPhaseTime>& units) {
  nlohmann::json a = nlohmann::json::array();
  for (const UnitPhaseTime& u : units) a.push_back({{"name", u.name}, {"fwd_s", u.fwd_s}, {"bwd_s", u.bwd_s}});
  return a;
}

}  // namespace

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
