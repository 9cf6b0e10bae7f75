// Running a plan on one rank, and merging the ranks' results into a RunRecord: the entry points of
// `zeroplan run`.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "zeroplan/exec/communicator.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/profiles/run_record.h"
#include "zeroplan/profiles/zoo.h"

namespace zeroplan::exec {

struct RunOptions {
  std::string model = "gpt";        // zoo name
  std::string preset;               // e.g. "gpt2-tiny"
  zoo::Options model_options;       // overrides of the preset
  std::string torchscript;          // a scripted nn.Sequential instead of a zoo model ("" none)
  std::vector<int64_t> input_shape; // with torchscript: one sample's input shape
  zoo::ScriptTask script_task;      // with torchscript: the task it trains on
  Plan plan;
  int steps = 10;
  int warmup_steps = 1;             // excluded from the statistics, still run and recorded
  std::string device = "cpu";       // "cpu" | "cuda[:i]"
  std::int64_t device_memory_limit_bytes = 0;  // 0: none; applies from after the model is built
  std::string trace_path;           // "" none; "{rank}" is replaced, else "-rank<r>" goes before ".json"
  bool progress = false;            // one line per step on stderr (rank 0): step, loss, step time
  bool keep_parameters = false;     // RunResult::parameters (tests)
  int threads = 0;                  // intra-op threads of this rank (0: leave torch's setting)
  int ranks_per_node = 0;           // consecutive ranks per node (LocalSGD's groups); 0: all on one node
  // Checkpoints: every `checkpoint_every` steps (counted from step 0 of the training, across resumes)
  // into checkpoint_dir; resume_dir: start from its newest checkpoint (its step, states and data order).
  std::string checkpoint_dir;
  int checkpoint_every = 0;
  int checkpoint_keep = 0;          // keep the newest N checkpoints of checkpoint_dir (0: all)
  std::string resume_dir;
  bool resume_other_run = false;    // resume a checkpoint whose run identity (model, seed, data order) differs
};

// Throws ExecError, in one line, when the executor does not run `plan` (context.cpp): a knob it does not
// run, an invalid plan, a dtype combination (16-bit LocalSGD, AdaScale with loss scaling), AdaScale with
// LocalSGD. What every rank checks again; the launcher calls it before any rank starts.
void check_plan_runs(const Plan& plan);
// Why `options` cannot checkpoint or resume ("" when it can): LocalSGD keeps a replica per rank, SlowMo
// and AdaScale state that checkpoints do not hold.
std::string checkpoint_refusal(const RunOptions& options);
// The newest step of `dir` that has a checkpoint (step-<N>/manifest.json), -1 when none (checkpoint.cpp).
std::int64_t newest_checkpoint(const std::string& dir);
// One line saying why dir's newest checkpoint is another run's than `plan` (checkpoint.cpp): its seed or
// global batch (the data order) differ; "" when they match, when dir has none, or when its manifest
// predates run identities. The ranks check the model too, and refuse unless told --resume-other-run.
std::string other_run(const std::string& dir, const Plan& plan);
// Retention in `dir` (checkpoint.cpp), by rank 0 only: removes the step folders without a manifest (saves
// that were interrupted) older than `newest` (every one when newest < 0, at a run's start) and, when
// keep > 0, every checkpoint but the newest `keep`. Returns the folders removed, oldest first. Never removes
// the checkpoint of step `newest`.
std::vector<std::string> prune_checkpoints(const std::string& dir, std::int64_t newest, int keep);

struct RunResult {
  int rank = 0;
  std::string backend;
  std::string device;
  int threads = 1;                     // intra-op threads this rank computed with
  std::vector<double> step_times_s;                          // every step, warm-up included
  std::vector<std::map<std::string, double>> phase_times_s;  // per step: phase -> seconds
  // Per unit, in model order: forward and backward seconds of one microbatch (the step's time in the
  // unit over its microbatches; the loss is the last unit's forward, recompute is in neither), median
  // over the measured steps.
  std::vector<UnitPhaseTime> units;
  std::vector<double> losses;          // per step, mean over the global batch (same on every rank)
  std::vector<double> loss_scales;     // per step, with loss scaling (same on every rank)
  std::vector<int> skipped_steps;      // steps skipped for non-finite gradients (every rank skips together)
  std::vector<double> lr_gains;        // AdaScale's gain per step (same on every rank); empty without it
  std::int64_t device_peak_bytes = 0;  // over the steps, including the resident state
  std::int64_t host_peak_bytes = 0;
  std::int64_t host_reserved_bytes = 0;  // HostPool::reserved_bytes at the end of the run
  std::string device_peak_at;          // Recorder::peak_at
  std::vector<std::string> fallbacks;
  // CPU time over the measured steps (Linux /proc; -1 elsewhere): the whole machine's busy seconds and
  // this rank's own (all its threads, Gloo's included), over `cpu_wall_s`; `cores` of the machine.
  double cpu_machine_busy_s = -1, cpu_own_s = -1, cpu_wall_s = 0;
  int cores = 0;
  std::string host;                    // the machine it ran on (gethostname)
  std::string trace_path;              // written trace, or ""
  // Pipeline stages: this rank's stage (-1 without), its units, and per measured step its compute time
  // and the time from the step's start to its last backward (StepStats::pipeline_busy_s, _span_s).
  int pipeline_stage = -1;
  int first_unit = 0, stage_units = 0;
  std::vector<double> pipeline_busy_s, pipeline_span_s;
  std::vector<OffloadedActivations> offloaded_activations;  // activation offload's picks (RunRecord's)
  std::vector<std::pair<std::string, torch::Tensor>> parameters;  // when keep_parameters; not in JSON
};

// The model of `options`: the TorchScript file when given, else the zoo model. Seed: options.plan.seed.
zoo::Model build_run_model(const RunOptions& options);

// Builds the model (same seed on every rank), runs warm-up + measured steps, writes the trace. The
// model seed is options.plan.seed. Collective: every rank calls it with the same options.
// Throws ExecError (incl. OutOfDeviceMemory), CommError, SchemaError (bad model or plan).
RunResult run_rank(const RunOptions& options, Communicator& comm);

// One RunRecord from every rank's result (any order). Step times and phases per step are the slowest
// rank's; statistics over the measured steps. Unit times are the slowest rank's per unit and phase.
RunRecord merge_results(const RunOptions& options, const std::vector<RunResult>& ranks);

// Per-rank results travel from rank processes to the launcher as JSON (parameters excluded).
void to_json(nlohmann::json& j, const RunResult& result);
void from_json(const nlohmann::json& j, RunResult& result);

// The trace path of `rank` for a user-given path (see RunOptions::trace_path).
std::string rank_trace_path(const std::string& path, int rank);

}  // namespace zeroplan::exec
