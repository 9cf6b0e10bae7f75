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

namespace {

// What a rank reports after its steps: its CPU use over the measured steps, each unit's median times, its
// pipeline stage, what activation offload picked, and its peaks (the larger of the steps' and those kept
// before a checkpoint's save).
void summarize_rank(const RunOptions& options, const zoo::Model& model, Executor& executor, Device& device,
                    const Recorder& recorder, const CpuTimes& cpu_from, std::int64_t device_peak, std::int64_t host_peak,
                    const std::vector<std::vector<double>>& unit_fwd, const std::vector<std::vector<double>>& unit_bwd,
                    RunResult& result) {
  const std::size_t n_units = model.units.size();
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
  result.device_peak_bytes = std::max(device_peak, device.peak_bytes());
  result.host_peak_bytes = std::max(host_peak, device.host_pool().peak_bytes());
  result.host_reserved_bytes = device.host_pool().reserved_bytes();
  result.device_peak_at = recorder.peak_at();
  device.set_limit(0);
}

}  // namespace

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
  const std::int64_t first_step = options.resume_dir.empty() ? 0 : executor.load_checkpoint(options.resume_dir, options.resume_other_run);
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
    const SideLaneSeconds lane0 = device->side_lane().busy_s();
    StepStats st = executor.step(first_step + s);
    // The side lane's copies (activation offload), overlapping the phases: seconds it copied each way this
    // step, in the phases of the simulator's lanes (d2h, h2d) beside the step's other copies.
    const SideLaneSeconds lane1 = device->side_lane().busy_s();
    if (const double d = lane1.d2h - lane0.d2h; d > 0) st.phase_s["d2h"] += d;
    if (const double h = lane1.h2d - lane0.h2d; h > 0) st.phase_s["h2d"] += h;
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
  summarize_rank(options, model, executor, *device, recorder, cpu_from, device_peak, host_peak, unit_fwd, unit_bwd, result);

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

}  // namespace zeroplan::exec
