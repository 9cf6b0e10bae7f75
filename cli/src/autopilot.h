// Private to autopilot: its options, one plan's run (a Trial), the fidelity grid, and the report. The
// orchestration is cmd_autopilot.cpp; runs autopilot_trials.cpp; the grid's fidelity and calibration
// autopilot_fidelity.cpp; report.md and report.html (the tuner's report blocks) autopilot_report.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"
#include "python_bridge.h"
#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/comparison.h"
#include "zeroplan/profiles/knobs.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/profiles/prediction.h"
#include "zeroplan/profiles/run_record.h"
#include "zeroplan/profiles/zoo.h"
#include "zeroplan/tuner/report_blocks.h"

namespace zeroplan::cli::autopilot {

namespace fs = std::filesystem;

struct Args {
  std::string model = "gpt";
  std::string preset;
  std::vector<std::string> model_opts;
  PythonModelArgs python;          // --python FILE.py:FACTORY: the user's own nn.Module (profiled and tuned)
  std::string torchscript;         // the user's model instead of a built-in one
  std::vector<int64_t> input_shape;
  zoo::ScriptTask task;
  std::string cluster;             // "" = probe this machine
  std::string output_dir;          // "" = autopilot-<date>-<time>
  std::int64_t budget_bytes = 0;   // 0 = budget_fraction x the default plan's predicted peak
  double budget_fraction = 0.7;
  // Share of the budget the tuner keeps free for what the prediction misses (device peaks are predicted within
  // 0.3% on the grid, 3% under activation offload): a plan predicted at 99.9% of the budget OOMs at +0.2%.
  double headroom = 0.02;
  int verify = 3;
  int nproc = 2;
  int profile_concurrent_ranks = 0;  // ranks computing each unit at once while profiling (0: nproc)
  int global_batch = 8;
  int steps = 8;
  int warmup = 2;
  double probe_max_age_h = 24;
  std::string knobs = tune_knobs_supported_by(Component::run);  // the tune knobs the executor runs (knobs.h)
  bool grid = false;               // also run the fidelity grid (no budget) and report the errors
  bool calibrate = false;          // with grid: fit factors on half the grid, judge on the other half
  int rounds = 1;                  // with grid: run the grid this many times, plans interleaved
  std::vector<std::string> grid_plans;  // with grid: only these plans ("" = all 14)
  // The tuner may vary LocalSGD/SlowMo/AdaScale, and autopilot runs the default plan and the same plan
  // with LocalSGD beside it (one rank per node) to show what the speed costs in loss.
  bool allow_approximate_averaging = false;
};

std::string mib(double bytes);  // "12.3 MiB" (the report's unit)
void say(const Globals& g, const std::string& line);
std::string describe(const Plan& p);  // "stage 3, reshard, offload params, micro batch 2 x 2"
std::string percent(double v);        // "12.3%", "n/a" for NaN

// ---- runs (autopilot_trials.cpp) ----

struct Trial {
  std::string label;    // "#1", "default", "g07"
  Plan plan;
  Prediction prediction;
  bool ran = false;     // the run finished
  int exit_code = 0;
  std::string failure;  // the run's one-line error
  std::optional<RunRecord> record;
  std::optional<Comparison> comparison;
  std::vector<double> round_steps;  // grid with --rounds: every round's measured step, sorted
};
Trial make_trial(std::string label, const Plan& plan, const Prediction& prediction);
// Of one plan's rounds, the one with the median measured step (the lower middle of an even count),
// carrying every round's step; the first round when none ran.
Trial median_round(std::vector<Trial> rounds);

// The largest device peak over the ranks of a run, and the span where that rank reached it.
struct DevicePeak {
  std::int64_t bytes = 0;
  std::string at;
};
DevicePeak device_peak(const RunRecord& r);

// The fidelity grid: plans covering every knob the executor runs, built on the default DDP plan;
// variants whose microbatch count does not divide the per-rank batch are left out.
struct GridPlan {
  std::string label;  // g01, g02, ...
  Plan plan;
  // LocalSGD and SlowMo rows run each rank as its own node (`run --ranks-per-node 1`, predicted on a
  // cluster of one device per node): on one node LocalSGD reduces gradients every step, as DDP does.
  bool rank_per_node = false;
};
std::vector<GridPlan> fidelity_grid(int nproc, int global_batch);
std::vector<std::string> grid_labels();  // every grid plan's label, g01 ... g24

// A copy of `c` with each of `nproc` ranks on its own node (what LocalSGD needs to average over nodes).
ClusterProfile one_device_per_node(const ClusterProfile& c, int nproc);

struct RunSetup {
  const Args& a;
  const Globals& g;
  const ModelProfile& profile;
  const ClusterProfile& cluster;  // the one predictions are made on
  std::string opts;               // model options for `zeroplan run --opt`
  int ranks_per_node = 0;         // `zeroplan run --ranks-per-node` (0: the launcher's default, one node)
};
// Simulates `t.plan`, runs it with `zeroplan run` on local ranks (with `--device-memory-limit` when
// `limit` > 0), compares, and writes everything into `dir`.
void run_trial(Trial& t, const fs::path& dir, const RunSetup& r, std::int64_t limit);

// With --allow-approximate-averaging: the default plan and the same plan with LocalSGD every 4 steps
// (each rank its own node, so it averages) run unbudgeted into out/price/, and what the speed costs.
struct PriceRuns {
  std::optional<AveragingPrice> price;
  std::string failure;  // why there is no price
};
PriceRuns price_step(const RunSetup& r, const fs::path& out);

// ---- the grid's fidelity (autopilot_fidelity.cpp) ----

// What calibration needs: the profile and the cluster the grid was predicted on, and where to write.
struct CalibrationInput {
  const ModelProfile& profile;
  const ClusterProfile& cluster;
  fs::path out;
};
// The fidelity section of the report (writes fidelity.json, and with `calibration`
// cluster_calibrated.json into `out`): one row per grid plan, the summary against the targets, and
// the calibrated predictions judged on plans the fit did not see.
std::vector<tuner::report::Block> fidelity_section(const std::vector<Trial>& grid, const fs::path& out,
                                                   const std::optional<CalibrationInput>& calibration);

// ---- the report (autopilot_report.cpp) ----

struct ReportInput {
  std::string model;        // name or TorchScript file
  std::string model_opts;   // "layers=4,..." or the preset
  std::int64_t params = 0;
  int nproc = 0;
  bool gloo = true;         // ranks talk over Gloo on 127.0.0.1
  int global_batch = 0;
  std::string cluster;
  int cores = 0;
  std::int64_t budget_bytes = 0;
  double headroom = 0;                  // the share of the budget the tuner kept free
  std::int64_t default_need_bytes = 0;  // the default plan's predicted device bytes
  const std::vector<Trial>& trials;
  const std::vector<Trial>& grid;
  std::vector<tuner::report::Block> fidelity;  // fidelity_section's, empty without --grid
  std::optional<PriceRuns> price;              // with --allow-approximate-averaging
  double elapsed_s = 0;
};
// Writes report.md and report.html into `out`; returns the Markdown.
std::string write_report(const ReportInput& in, const fs::path& out);

}  // namespace zeroplan::cli::autopilot
