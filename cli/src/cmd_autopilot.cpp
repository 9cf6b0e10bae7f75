// zeroplan autopilot: the whole loop on this machine in one command. Profile a built-in model, probe
// the machine (or reuse a fresh probe), tune under a device-memory budget that the default DDP plan
// does not fit, run the top plans and the default for real on local ranks with that budget enforced,
// compare each with its prediction, and write one report (Markdown and self-contained HTML).
#include <fmt/chrono.h>
#include <fmt/core.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <functional>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "cli.h"
#include "model_args.h"
#include "zeroplan/config.h"
#include "zeroplan/exec/probe.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/profiles/knobs.h"
#include "zeroplan/profiles/profiler.h"
#include "zeroplan/profiles/zoo.h"
#include "zeroplan/sim/compare.h"
#include "zeroplan/sim/fidelity.h"
#include "zeroplan/sim/simulate.h"
#include "zeroplan/tuner/constraints.h"
#include "zeroplan/tuner/report.h"
#include "zeroplan/tuner/tune.h"

extern char** environ;

namespace zeroplan::cli {
namespace {

namespace fs = std::filesystem;

struct AutopilotArgs {
  std::string model = "gpt";
  std::string preset;
  std::vector<std::string> model_opts;
  std::string torchscript;         // the user's model instead of a built-in one
  std::vector<int64_t> input_shape;
  zoo::ScriptTask task;
  std::string cluster;             // "" = probe this machine
  std::string output_dir;          // "" = autopilot-<date>-<time>
  std::int64_t budget_bytes = 0;   // 0 = budget_fraction x the default plan's predicted peak
  double budget_fraction = 0.7;
  int verify = 3;
  int nproc = 2;
  int global_batch = 8;
  int steps = 8;
  int warmup = 2;
  double probe_max_age_h = 24;
  std::string knobs = tune_knobs_supported_by(Component::run);  // the tune knobs the executor runs (knobs.h)
  bool grid = false;               // also run the fidelity grid (no budget) and report the errors
  bool calibrate = false;          // with grid: fit factors on half the grid, judge on the other half
  int rounds = 1;                  // with grid: run the grid this many times, plans interleaved
  std::vector<std::string> grid_plans;  // with grid: only these plans ("" = all 14)
};

// The built-in default: a GPT sized so that a step takes a fraction of a second on 2 CPU cores while
// parameters, optimizer state and activations all matter for memory.
const zoo::Options kDefaultGpt = {{"layers", "4"}, {"hidden", "256"}, {"heads", "4"}, {"seq", "128"}, {"vocab", "8192"}};

std::string gib(double bytes) { return fmt::format("{:.1f} MiB", bytes / double(1 << 20)); }

void say(const Globals& g, const std::string& line) {
  if (!g.quiet) fmt::print(stderr, "[autopilot] {}\n", line);
}


// Runs `zeroplan <args>` as a child process with stdout and stderr to `log`; returns its exit code.
int run_child(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<std::string> argv{"zeroplan"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw ExitError(kRunFailed, fmt::format("cannot start a run: {}", std::strerror(rc)));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string last_line(const fs::path& file) {
  std::ifstream in(file);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty() && line.find("[autopilot]") == std::string::npos) last = line;
  return last;
}

std::string describe(const Plan& p) {
  std::string s = fmt::format("stage {}", p.zero_stage);
  if (p.zero_stage == 3) s += p.reshard_after_forward ? ", reshard" : ", no reshard";
  if (p.offload.params) s += ", offload params";
  if (p.offload.grads) s += ", offload grads";
  if (p.offload.optimizer) s += ", offload optimizer";
  if (p.offload.activations_ratio > 0) s += fmt::format(", offload {:.0f}% activations", 100 * p.offload.activations_ratio);
  if (p.checkpointing.mode == Checkpointing::Mode::all) s += ", checkpoint all";
  else if (p.checkpointing.mode == Checkpointing::Mode::units) s += fmt::format(", checkpoint {} units", p.checkpointing.units.size());
  s += fmt::format(", micro batch {} x {}", p.micro_batch, p.microbatches);
  return s;
}

struct Trial {
  std::string label;    // "#1", "default"
  Plan plan;
  Prediction prediction;
  bool ran = false;     // the run finished
  int exit_code = 0;
  std::string failure;  // the run's one-line error
  std::optional<RunRecord> record;
  std::optional<Comparison> comparison;
  std::vector<double> round_steps;  // grid with --rounds: every round's measured step, sorted
};

// Of one plan's rounds, the one with the median measured step (the lower middle of an even count),
// carrying every round's step; the first round when none ran.
Trial median_round(std::vector<Trial> rounds) {
  std::vector<Trial*> ran;
  for (Trial& t : rounds)
    if (t.ran) ran.push_back(&t);
  if (ran.empty()) return std::move(rounds.front());
  std::sort(ran.begin(), ran.end(), [](const Trial* x, const Trial* y) {
    return x->record->step_time_median_s < y->record->step_time_median_s;
  });
  std::vector<double> steps;
  for (const Trial* t : ran) steps.push_back(t->record->step_time_median_s);
  Trial m = std::move(*ran[(ran.size() - 1) / 2]);
  m.round_steps = std::move(steps);
  return m;
}

Trial make_trial(std::string label, const Plan& plan, const Prediction& prediction) {
  Trial t;
  t.label = std::move(label);
  t.plan = plan;
  t.prediction = prediction;
  return t;
}

// The largest device peak over the ranks of a run, and the span where that rank reached it.
struct DevicePeak {
  std::int64_t bytes = 0;
  std::string at;
};
DevicePeak device_peak(const RunRecord& r) {
  DevicePeak d;
  for (const auto& p : r.peaks) {
    if (p.device_peak_bytes > d.bytes) d = {p.device_peak_bytes, p.device_peak_at};
  }
  return d;
}

// A horizontal grouped bar chart: per trial, predicted vs measured.
std::string bar_svg(const std::string& title, const std::vector<Trial>& trials,
                    const std::function<std::optional<double>(const Trial&, bool measured)>& value,
                    const std::string& unit, std::optional<double> limit) {
  const int row = 34, left = 190, width = 640, height = 50 + row * static_cast<int>(trials.size()) + 30;
  double vmax = limit.value_or(0);
  for (const auto& t : trials)
    for (bool m : {false, true})
      if (auto v = value(t, m)) vmax = std::max(vmax, *v);
  if (vmax <= 0) vmax = 1;
  const double scale = (width - left - 90) / vmax;
  std::string s = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' font-family='sans-serif' font-size='12'>"
      "<text x='10' y='18' font-size='14' font-weight='bold'>{}</text>",
      width, height, title);
  int y = 36;
  for (const auto& t : trials) {
    s += fmt::format("<text x='10' y='{}'>{}</text>", y + 14, t.label + ": " + describe(t.plan).substr(0, 24));
    int k = 0;
    for (bool m : {false, true}) {
      auto v = value(t, m);
      int yy = y + k * 14;
      const char* color = m ? "#d95f02" : "#1b9e77";
      if (v) {
        s += fmt::format("<rect x='{}' y='{}' width='{:.1f}' height='12' fill='{}'/>", left, yy, std::max(1.0, *v * scale), color);
        s += fmt::format("<text x='{:.1f}' y='{}'>{:.4g} {}</text>", left + *v * scale + 4, yy + 10, *v, unit);
      } else {
        s += fmt::format("<text x='{}' y='{}' fill='#999'>{}</text>", left, yy + 10, m ? "not measured (run failed)" : "n/a");
      }
      ++k;
    }
    y += row;
  }
  if (limit) {
    double x = left + *limit * scale;
    s += fmt::format("<line x1='{0:.1f}' y1='30' x2='{0:.1f}' y2='{1}' stroke='#c00' stroke-dasharray='4'/>"
                     "<text x='{0:.1f}' y='{2}' fill='#c00'>budget</text>", x, y, y + 12);
  }
  s += fmt::format("<rect x='{}' y='{}' width='12' height='10' fill='#1b9e77'/><text x='{}' y='{}'>predicted</text>"
                   "<rect x='{}' y='{}' width='12' height='10' fill='#d95f02'/><text x='{}' y='{}'>measured</text></svg>",
                   left, height - 14, left + 16, height - 5, left + 100, height - 14, left + 116, height - 5);
  return s;
}

std::string html_escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      default: out += c;
    }
  }
  return out;
}

// The fidelity grid: plans covering every knob the executor runs (zero_stage 0-3, resharding on and
// off, each offload, microbatches 1/2/4, checkpointing on and off), built on the default DDP plan.
// Variants whose microbatch count does not divide the per-rank batch are left out.
std::vector<std::pair<std::string, Plan>> fidelity_grid(int nproc, int global_batch) {
  const Plan base = Plan::default_ddp(nproc, global_batch);
  const int per_rank = base.micro_batch;
  std::vector<std::pair<std::string, Plan>> out;
  auto add = [&](const std::string& label, int stage, int microbatches, auto&& tweak) {
    if (per_rank % microbatches != 0) return;
    Plan p = base;
    p.zero_stage = stage;
    p.reshard_after_forward = stage == 3;
    p.microbatches = microbatches;
    p.micro_batch = per_rank / microbatches;
    tweak(p);
    out.emplace_back(label, p);
  };
  auto none = [](Plan&) {};
  auto ckpt = [](Plan& p) { p.checkpointing.mode = Checkpointing::Mode::all; };
  add("g01", 0, 1, none);
  add("g02", 0, 1, ckpt);
  add("g03", 0, 4, none);
  add("g04", 1, 1, none);
  add("g05", 1, 2, [](Plan& p) { p.offload.optimizer = true; });
  add("g06", 2, 1, none);
  add("g07", 2, 2, none);
  add("g08", 2, 1, [](Plan& p) { p.offload.optimizer = p.offload.grads = true; });
  add("g09", 3, 1, none);
  add("g10", 3, 1, [](Plan& p) { p.reshard_after_forward = false; });
  add("g11", 3, 1, [](Plan& p) { p.offload.params = p.offload.grads = p.offload.optimizer = true; });
  add("g12", 3, 2, ckpt);
  add("g13", 3, 4, [](Plan& p) {
    p.checkpointing.mode = Checkpointing::Mode::all;
    p.offload.params = p.offload.grads = p.offload.optimizer = true;
  });
  add("g14", 1, 4, ckpt);
  return out;
}

// Every grid plan's label (a world of 1 and a batch of 4 admit every microbatch count of the grid).
std::vector<std::string> grid_labels() {
  std::vector<std::string> labels;
  for (const auto& [label, plan] : fidelity_grid(1, 4)) labels.push_back(label);
  return labels;
}

struct RunSetup {
  const AutopilotArgs& a;
  const Globals& g;
  const ModelProfile& profile;
  const ClusterProfile& cluster;  // the one predictions are made on
  std::string opts;               // model options for `zeroplan run --opt`
};

// Simulates `t.plan`, runs it for real (with `--device-memory-limit` when `limit` > 0), compares, and
// writes everything into `dir`.
void run_trial(Trial& t, const fs::path& dir, const RunSetup& r, std::int64_t limit) {
  const AutopilotArgs& a = r.a;
  fs::create_directories(dir);
  write_document(dir / "plan.json", t.plan);
  sim::Simulation s = sim::simulate_step(r.profile, r.cluster, t.plan);
  {
    std::ofstream tr(dir / "predicted_trace.json", std::ios::binary);
    tr << s.trace_json();
  }
  t.prediction = s.prediction;
  t.prediction.trace_path = (dir / "predicted_trace.json").string();
  write_document(dir / "prediction.json", t.prediction);
  say(r.g, fmt::format("4/5 running {} ({}) on {} ranks for {} steps", t.label, describe(t.plan), a.nproc, a.steps));
  std::vector<std::string> args{"run", "--nproc", std::to_string(a.nproc),
                                "--plan", (dir / "plan.json").string(), "--steps", std::to_string(a.steps),
                                "--warmup", std::to_string(a.warmup),
                                "--trace", (dir / "measured_trace.json").string(), "-o", (dir / "run_record.json").string()};
  if (limit > 0) args.insert(args.end(), {"--device-memory-limit", std::to_string(limit)});
  if (!a.torchscript.empty()) {
    for (auto& x : torchscript_argv(a.torchscript, a.input_shape, a.task)) args.push_back(x);
  } else {
    args.insert(args.end(), {"--model", a.model});
    if (!a.preset.empty()) args.insert(args.end(), {"--preset", a.preset});
    if (!r.opts.empty()) args.insert(args.end(), {"--opt", r.opts});
  }
  t.exit_code = run_child(args, dir / "run.log");
  if (t.exit_code != 0 || !fs::exists(dir / "run_record.json")) {
    t.failure = last_line(dir / "run.log");
    say(r.g, fmt::format("    run failed (exit {}): {}", t.exit_code, t.failure));
    return;
  }
  t.ran = true;
  t.record = read_document<RunRecord>(dir / "run_record.json");
  sim::CompareOptions co;
  co.set_model(&r.profile).set_zeroplan_version(ZEROPLAN_VERSION);
  Comparison c = sim::compare(t.prediction, *t.record, co);
  c.predicted = (dir / "prediction.json").string();
  c.measured = (dir / "run_record.json").string();
  write_document(dir / "comparison.json", c);
  t.comparison = c;
  if (!t.record->trace_paths.empty() && fs::exists(t.record->trace_paths.front())) {
    std::ifstream pt(dir / "predicted_trace.json"), mt(t.record->trace_paths.front());
    std::stringstream ps, ms;
    ps << pt.rdbuf();
    ms << mt.rdbuf();
    std::ofstream ov(dir / "overlay_trace.json", std::ios::binary);
    ov << sim::overlay_traces(ps.str(), ms.str());
  }
  const std::int64_t peak = device_peak(*t.record).bytes;
  say(r.g, fmt::format("    step {:.4f} s measured vs {:.4f} s predicted; device peak {} measured vs {} predicted",
                       t.record->step_time_median_s, t.prediction.step_time_s, gib(double(peak)),
                       gib(double(t.prediction.device.peak_bytes))));
}

std::string percent(double v) { return std::isnan(v) ? "n/a" : fmt::format("{:.1f}%", 100 * v); }

std::string summary_text(const sim::FidelitySummary& f) {
  auto met = [](bool ok) { return ok ? "met" : "**missed**"; };
  std::string md;
  md += fmt::format("{} plans. Step time: median |error| {}, maximum {} ({}); target median under 10%: {}.\n", f.plans,
                    percent(f.time.median_abs_error), percent(f.time.max_abs_error), f.time.max_label,
                    met(f.time.median_abs_error < 0.10));
  md += fmt::format("Peak device memory: median |error| {}, maximum {} ({}); target median under 5%: {}.\n",
                    percent(f.memory.median_abs_error), percent(f.memory.max_abs_error), f.memory.max_label,
                    met(f.memory.median_abs_error < 0.05));
  md += fmt::format("Ranking of the plans, measured vs predicted (Spearman): step time {:.3f}, peak memory {:.3f}; "
                    "target above 0.9: {}.\n\n",
                    f.time_spearman, f.memory_spearman, met(f.time_spearman > 0.9));
  return md;
}

nlohmann::json summary_json(const sim::FidelitySummary& f) {
  auto num = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  return {{"plans", f.plans},
          {"time_median_abs_error", f.time.median_abs_error}, {"time_max_abs_error", f.time.max_abs_error},
          {"time_max_plan", f.time.max_label},
          {"memory_median_abs_error", f.memory.median_abs_error}, {"memory_max_abs_error", f.memory.max_abs_error},
          {"memory_max_plan", f.memory.max_label},
          {"time_spearman", num(f.time_spearman)}, {"memory_spearman", num(f.memory_spearman)}};
}

std::optional<double> metric(const Trial& t, const std::string& name) {
  if (!t.comparison) return std::nullopt;
  for (const Metric& m : t.comparison->metrics)
    if (m.name == name && m.predicted > 0 && m.measured > 0) return m.measured / m.predicted;
  return std::nullopt;
}

// What calibration needs: the profile and the cluster the grid was predicted on, and where to write.
struct CalibrationInput {
  const ModelProfile& profile;
  const ClusterProfile& cluster;
  fs::path out;
};

// Calibration, judged fairly: fit ClusterProfile factors (the median measured / predicted compute and
// collective time) on the odd-numbered grid plans, re-simulate the even-numbered ones with them, and
// judge those only.
std::string calibration_section(const std::vector<Trial>& grid, const CalibrationInput& in, nlohmann::json& j) {
  std::vector<double> compute, comm;
  std::string fitted_on, judged_on;
  for (std::size_t i = 0; i < grid.size(); i += 2) {
    if (!grid[i].ran) continue;
    if (auto r = metric(grid[i], "phase.compute_s")) compute.push_back(*r);
    if (auto r = metric(grid[i], "phase.comm_s")) comm.push_back(*r);
    fitted_on += (fitted_on.empty() ? "" : ", ") + grid[i].label;
  }
  std::string md = "### Calibrated\n\n";
  if (compute.empty()) return md + "No calibration plan ran, so nothing was fitted.\n\n";
  ClusterProfile cal = in.cluster;
  // The predictions already carry the cluster's factors (e.g. the probe's compute slowdown): refine them.
  cal.calibration.compute_time_scale = in.cluster.calibration.compute_time_scale * sim::median(compute);
  cal.calibration.comm_time_scale = in.cluster.calibration.comm_time_scale * (comm.empty() ? 1.0 : sim::median(comm));
  cal.provenance.erase("calibration.compute_time_scale");
  cal.provenance.erase("calibration.comm_time_scale");
  cal.provenance["calibration"] =
      Provenance{"calibration", fmt::format("zeroplan autopilot --calibrate: median measured / predicted compute and "
                                            "collective time over plans {}", fitted_on)};
  write_document(in.out / "cluster_calibrated.json", cal);
  std::vector<sim::FidelityRow> rows;
  for (std::size_t i = 1; i < grid.size(); i += 2) {
    const Trial& t = grid[i];
    if (!t.ran) continue;
    const std::int64_t peak = device_peak(*t.record).bytes;
    const Prediction pred = sim::simulate(in.profile, cal, t.plan);
    rows.push_back({t.label, pred.step_time_s, t.record->step_time_median_s, double(pred.device.peak_bytes), double(peak)});
    judged_on += (judged_on.empty() ? "" : ", ") + t.label;
  }
  md += fmt::format("Fitted on {} (compute time x{:.3f}, collective time x{:.3f}: `cluster_calibrated.json`), then "
                    "judged on the other plans only ({}), whose predictions were made again with those factors:\n\n",
                    fitted_on, cal.calibration.compute_time_scale, cal.calibration.comm_time_scale, judged_on);
  md += "| plan | calibrated predicted step s | measured step s | error |\n|---|---|---|---|\n";
  for (const auto& r : rows)
    md += fmt::format("| {} | {:.4f} | {:.4f} | {:+.1f}% |\n", r.label, r.predicted_time_s, r.measured_time_s,
                      100 * relative_error(r.predicted_time_s, r.measured_time_s));
  j["calibration"] = {{"compute_time_scale", cal.calibration.compute_time_scale},
                      {"comm_time_scale", cal.calibration.comm_time_scale},
                      {"fitted_on", fitted_on}, {"judged_on", judged_on}};
  if (!rows.empty()) {
    const sim::FidelitySummary f = sim::summarize_fidelity(rows);
    md += "\n" + summary_text(f);
    j["calibration"]["summary"] = summary_json(f);
  }
  return md;
}

// The fidelity section of the report (and fidelity.json): one row per grid plan that ran; with
// `calibration`, also the calibrated predictions judged on plans the fit did not see.
std::string fidelity_section(const std::vector<Trial>& grid, const fs::path& out,
                             const std::optional<CalibrationInput>& calibration) {
  std::vector<sim::FidelityRow> rows;
  nlohmann::json j = {{"schema", "zeroplan.fidelity/1"}, {"rows", nlohmann::json::array()}};
  std::string md = "## Fidelity over the grid\n\n";
  md += "Each plan ran without a memory limit. Predicted peak: the simulator's device allocations "
        "(`device.peak_bytes`); measured: the largest device peak over the ranks (counting allocator). "
        "Errors are (predicted - measured) / measured.\n\n";
  md += "| plan | knobs | predicted step s | measured step s | error | predicted peak | measured peak | error | measured peak in | largest source of error |\n";
  md += "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Trial& t : grid) {
    if (!t.ran) {
      md += fmt::format("| {} | {} | {:.4f} | failed | | {} | | | | {} |\n", t.label, describe(t.plan),
                        t.prediction.step_time_s, gib(double(t.prediction.device.peak_bytes)), t.failure);
      continue;
    }
    const DevicePeak peak = device_peak(*t.record);
    const std::string& peak_at = peak.at;
    sim::FidelityRow row{t.label, t.prediction.step_time_s, t.record->step_time_median_s,
                         double(t.prediction.device.peak_bytes), double(peak.bytes)};
    rows.push_back(row);
    j["rows"].push_back({{"label", row.label}, {"predicted_time_s", row.predicted_time_s},
                         {"measured_time_s", row.measured_time_s}, {"predicted_peak_bytes", row.predicted_peak_bytes},
                         {"measured_peak_bytes", row.measured_peak_bytes}});
    if (!t.round_steps.empty()) j["rows"].back()["measured_time_rounds_s"] = t.round_steps;
    const std::string source = t.comparison && !t.comparison->largest_error_sources.empty()
                                   ? t.comparison->largest_error_sources.front() : "";
    std::string measured = fmt::format("{:.4f}", row.measured_time_s);
    if (t.round_steps.size() > 1) {
      measured += fmt::format(" (rounds {:.4f}-{:.4f})", t.round_steps.front(), t.round_steps.back());
    }
    md += fmt::format("| {} | {} | {:.4f} | {} | {:+.1f}% | {} | {} | {:+.1f}% | {} | {} |\n", t.label, describe(t.plan),
                      row.predicted_time_s, measured,
                      100 * relative_error(row.predicted_time_s, row.measured_time_s), gib(row.predicted_peak_bytes),
                      gib(row.measured_peak_bytes), 100 * relative_error(row.predicted_peak_bytes, row.measured_peak_bytes),
                      peak_at, source);
  }
  if (rows.empty()) {
    md += "\nNo grid plan ran, so there is no summary.\n\n";
  } else {
    const sim::FidelitySummary f = sim::summarize_fidelity(rows);
    md += "\n" + summary_text(f);
    j["summary"] = summary_json(f);
  }
  if (calibration) {
    md += calibration_section(grid, *calibration, j);
  }
  std::ofstream(out / "fidelity.json") << j.dump(2) << "\n";
  return md;
}

int run_autopilot(AutopilotArgs& a, const Globals& g) {
  const auto started = std::chrono::steady_clock::now();
  if (a.output_dir.empty()) {
    std::time_t now = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    a.output_dir = std::string("autopilot-") + stamp;
  }
  const fs::path out = a.output_dir;
  fs::create_directories(out);
  say(g, fmt::format("output folder: {}", out.string()));
  if (a.nproc < 2) throw ExitError(kBadInput, fmt::format("--nproc {} must be at least 2", a.nproc));
  if (a.global_batch % a.nproc != 0)
    throw ExitError(kBadInput, fmt::format("--global-batch {} is not a multiple of --nproc {}", a.global_batch, a.nproc));

  // 1. Profile, with the threads each rank will have.
  zoo::Options overrides = a.preset.empty() && a.model == "gpt" && a.model_opts.empty() ? kDefaultGpt : zoo::Options{};
  for (auto& [k, v] : parse_key_values(a.model_opts, "--opt")) overrides[k] = v;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::string model_name = a.torchscript.empty() ? a.model : a.torchscript;
  say(g, fmt::format("1/5 profiling {} {} ({} thread(s) per rank, as the runs will have)", model_name, a.preset, std::max(1, cores / a.nproc)));
  if (!a.torchscript.empty() && a.input_shape.empty())
    throw ExitError(kBadInput, "--torchscript needs --input-shape (one sample, without the batch dimension)");
  zoo::Model model = a.torchscript.empty() ? zoo::build_model(a.model, a.preset, overrides, 0)
                                           : zoo::load_torchscript(a.torchscript, a.input_shape, 0, a.task);
  ProfileOptions po;
  const int per_rank = a.global_batch / a.nproc;
  po.batch = per_rank;
  po.batches.clear();
  for (int b = 1; b <= per_rank; b *= 2) po.batches.push_back(b);
  if (po.batches.size() < 2) po.batches = {per_rank, 2 * per_rank};
  po.threads = std::max(1, cores / a.nproc);
  ModelProfile profile = profile_model(model, po);
  write_document(out / "model_profile.json", profile);

  // 2. Probe, or reuse a fresh probe.
  ClusterProfile cluster;
  if (!a.cluster.empty()) {
    cluster = resolve_cluster(a.cluster);
    say(g, fmt::format("2/5 cluster from {}", a.cluster));
  } else {
    fs::path cache = local_probe_path();
    auto fresh = exec::fresh_probe(cache, std::chrono::seconds(static_cast<int64_t>(a.probe_max_age_h * 3600)), {a.nproc});
    if (fresh) {
      cluster = *fresh;
      say(g, fmt::format("2/5 reusing the probe in {} (younger than {} h)", cache.string(), a.probe_max_age_h));
    } else {
      say(g, "2/5 probing this machine (memory, copies, optimizer, Gloo collectives)");
      exec::ProbeOptions o;
      o.set_world_sizes({a.nproc});
      if (!g.quiet) o.progress = [](const std::string& line) { fmt::print(stderr, "[probe] {}\n", line); };
      cluster = exec::probe_cluster(o);
      fs::create_directories(cache.parent_path());
      write_document(cache, cluster);
    }
  }
  write_document(out / "cluster.json", cluster);

  // 3. The budget: the default plan must not fit.
  Plan ddp = Plan::default_ddp(a.nproc, a.global_batch);
  Prediction ddp_pred = sim::simulate(profile, cluster, ddp);
  std::int64_t budget = a.budget_bytes > 0 ? a.budget_bytes
                                           : static_cast<std::int64_t>(a.budget_fraction * double(ddp_pred.device.total_bytes()));
  say(g, fmt::format("3/5 device budget {} per rank (the default DDP plan is predicted to need {})", gib(budget),
                     gib(ddp_pred.device.total_bytes())));
  ClusterProfile budgeted = cluster;
  budgeted.device.mem_bytes = budget;
  budgeted.provenance["device.mem_bytes"] = Provenance{"estimate", "zeroplan autopilot budget"};

  tuner::TuneConstraints constraints;
  constraints.set_global_batch(a.global_batch).set_world_size(a.nproc).set_nodes(1);
  constraints.knobs = tuner::parse_knobs(a.knobs);
  tuner::TuneOptions topts;
  topts.set_top_k(std::max(a.verify, 1));
  if (!g.quiet) topts.set_progress(tuner::stderr_progress_bar());
  tuner::TuneResult tuned = tuner::tune(profile, budgeted, constraints, topts);
  fs::create_directories(out / "tune");
  tuner::write_reports(tuned, out / "tune");
  if (!tuned.best()) throw ExitError(kBadInput, fmt::format("no plan fits a budget of {} bytes; see {}", budget, (out / "tune/report.md").string()));

  // 4. Run the top plans and the default, budget enforced; then the fidelity grid, unlimited.
  std::vector<Trial> trials;
  for (size_t i = 0; i < tuned.ranking.size() && static_cast<int>(i) < a.verify; ++i)
    trials.push_back(make_trial(fmt::format("#{}", i + 1), tuned.ranking[i].plan, tuned.ranking[i].prediction));
  trials.push_back(make_trial("default", ddp, sim::simulate(profile, budgeted, ddp)));
  std::string opts;
  for (const auto& [k, v] : overrides) opts += (opts.empty() ? "" : ",") + k + "=" + v;
  const RunSetup setup{a, g, profile, budgeted, opts};
  int n = 0;
  for (auto& t : trials) {
    ++n;
    run_trial(t, out / (t.label == "default" ? std::string("default") : fmt::format("plan{}", n)), setup, budget);
  }
  std::vector<Trial> grid;
  if (a.grid) {
    // Rounds run every plan once each, so a slow spell of the machine falls on all plans alike; each
    // plan is then judged on its median round.
    std::vector<std::pair<std::string, Plan>> plans = fidelity_grid(a.nproc, a.global_batch);
    if (!a.grid_plans.empty()) {
      std::erase_if(plans, [&](const auto& p) {
        return std::find(a.grid_plans.begin(), a.grid_plans.end(), p.first) == a.grid_plans.end();
      });
    }
    std::vector<std::vector<Trial>> rounds(plans.size());
    for (int r = 0; r < a.rounds; ++r) {
      if (a.rounds > 1) say(g, fmt::format("4/5 grid round {} of {}", r + 1, a.rounds));
      for (std::size_t i = 0; i < plans.size(); ++i) {
        Trial t = make_trial(plans[i].first, plans[i].second, Prediction{});
        const fs::path dir = a.rounds > 1 ? out / "grid" / t.label / fmt::format("round{}", r + 1) : out / "grid" / t.label;
        run_trial(t, dir, setup, 0);
        rounds[i].push_back(std::move(t));
      }
    }
    for (auto& r : rounds) grid.push_back(median_round(std::move(r)));
  }

  // 5. The report.
  say(g, "5/5 writing the report");
  auto measured_peak = [](const Trial& t) -> std::optional<double> {
    if (!t.record || t.record->peaks.empty()) return std::nullopt;
    return double(device_peak(*t.record).bytes);
  };
  std::string md;
  md += "# zeroplan autopilot report\n\n";
  md += fmt::format("Model: `{}` {} ({} parameters), {} ranks over {}, global batch {}; machine: `{}` ({} cores).\n\n",
                    model_name, opts.empty() ? a.preset : opts, profile.total_params(), a.nproc,
                    tuned.ranking.front().prediction.plan.world_size > 1 ? "Gloo on 127.0.0.1" : "one process",
                    a.global_batch, cluster.name, cluster.host.cores);
  md += fmt::format("Device budget per rank: **{}** ({} bytes), enforced in the runs with `--device-memory-limit`. "
                    "The default plan (DDP, no offload) is predicted to need {}.\n\n",
                    gib(budget), budget, gib(ddp_pred.device.total_bytes()));
  md += "Every prediction below is the simulator's (labelled *predicted*); every measured figure comes from "
        "the run in this folder.\n\n";
  md += "| plan | knobs | predicted step s | measured step s | error | predicted peak | measured peak | error | verdict |\n";
  md += "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& t : trials) {
    auto mp = measured_peak(t);
    if (t.ran) {
      double et = relative_error(t.prediction.step_time_s, t.record->step_time_median_s);
      double em = mp ? relative_error(double(t.prediction.device.total_bytes()), *mp) : 0;
      md += fmt::format("| {} | {} | {:.4f} | {:.4f} | {:+.1f}% | {} | {} | {:+.1f}% | {} |\n", t.label, describe(t.plan),
                        t.prediction.step_time_s, t.record->step_time_median_s, 100 * et, gib(double(t.prediction.device.total_bytes())),
                        gib(*mp), 100 * em, t.comparison ? t.comparison->verdict : "");
    } else {
      md += fmt::format("| {} | {} | {:.4f} | failed | | {} | | | run failed: {} |\n", t.label, describe(t.plan),
                        t.prediction.step_time_s, gib(double(t.prediction.device.total_bytes())), t.failure);
    }
  }
  md += "\n## Why this plan\n\n";
  md += fmt::format("The tuner's full report, with the ranking, the Pareto front and why the winner beats the "
                    "runner-up and the default: [tune/report.md](tune/report.md).\n\n");
  for (const auto& t : trials) {
    if (!t.comparison) continue;
    md += fmt::format("### {} — largest sources of error\n\n", t.label);
    for (const auto& s : t.comparison->largest_error_sources) md += "- " + s + "\n";
    for (const auto& w : t.comparison->warnings) md += "- warning: " + w + "\n";
    md += "\n";
  }
  if (a.grid) {
    std::optional<CalibrationInput> cal;
    if (a.calibrate) cal.emplace(CalibrationInput{profile, budgeted, out});
    md += fidelity_section(grid, out, cal);
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  md += fmt::format("Files: `model_profile.json`, `cluster.json`, `tune/`, and per plan `plan.json`, "
                    "`prediction.json`, `run_record.json`, `comparison.json`, traces (open in Perfetto; "
                    "`overlay_trace.json` holds predicted and measured side by side), `run.log`. "
                    "Autopilot took {:.0f} s.\n", elapsed);
  {
    std::ofstream f(out / "report.md");
    f << md;
  }
  auto time_value = [](const Trial& t, bool measured) -> std::optional<double> {
    if (!measured) return t.prediction.step_time_s;
    if (!t.record) return std::nullopt;
    return t.record->step_time_median_s;
  };
  auto mem_value = [&](const Trial& t, bool measured) -> std::optional<double> {
    if (!measured) return double(t.prediction.device.total_bytes()) / double(1 << 20);
    auto m = measured_peak(t);
    if (!m) return std::nullopt;
    return *m / double(1 << 20);
  };
  std::string html = "<!doctype html><html><head><meta charset='utf-8'><title>zeroplan autopilot</title>"
                     "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}table{border-collapse:collapse}"
                     "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px}</style></head><body>";
  html += "<h1>zeroplan autopilot report</h1>";
  html += bar_svg("Step time: predicted vs measured", trials, time_value, "s", std::nullopt);
  html += bar_svg("Peak device memory per rank: predicted vs measured", trials, mem_value, "MiB",
                  double(budget) / double(1 << 20));
  html += "<pre>" + html_escape(md) + "</pre></body></html>\n";
  {
    std::ofstream f(out / "report.html");
    f << html;
  }
  if (!g.quiet) fmt::print(stderr, "\n{}\nreport: {} and {}\n", md, (out / "report.md").string(), (out / "report.html").string());
  return kOk;
}

}  // namespace

Action add_autopilot(CLI::App& app, const Globals& globals) {
  auto a = std::make_shared<AutopilotArgs>();
  app.add_option("--model", a->model, "Built-in model")->capture_default_str();
  app.add_option("--preset", a->preset, "Preset of the model");
  app.add_option("--opt", a->model_opts, "Model option key=value (default gpt: layers=4,hidden=256,heads=4,seq=128,vocab=8192)");
  add_torchscript_options(app, a->torchscript, a->input_shape, a->task);
  app.add_option("--cluster", a->cluster, "Use this ClusterProfile instead of probing the machine");
  app.add_option("--budget-bytes", a->budget_bytes, "Device memory per rank (default: a share of the default plan's need)");
  app.add_option("--budget-fraction", a->budget_fraction, "Budget as a share of the default plan's predicted peak")
      ->capture_default_str();
  app.add_option("--verify", a->verify, "Top plans to run for real")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--nproc", a->nproc, "Local ranks")->capture_default_str();
  app.add_option("--global-batch", a->global_batch, "Samples per optimizer step")->capture_default_str();
  app.add_option("--steps", a->steps, "Steps per run, warm-up included")->capture_default_str();
  app.add_option("--warmup", a->warmup, "Warm-up steps per run")->capture_default_str();
  app.add_option("--knobs", a->knobs, "Knobs the tuner may vary (those the executor runs)")->capture_default_str();
  app.add_option("--probe-max-age-h", a->probe_max_age_h, "Reuse a probe younger than this (hours)")->capture_default_str();
  app.add_option("-o,--output-dir", a->output_dir, "Output folder (default: autopilot-<date>-<time>)");
  app.add_flag("--grid", a->grid, "Also run the fidelity grid (14 plans over every knob, no budget) and report "
               "median and maximum errors and the rank correlation");
  app.add_flag("--calibrate", a->calibrate, "With --grid: fit compute and collective time factors on the odd-numbered "
               "grid plans and judge the calibrated predictions on the even-numbered ones")->needs("--grid");
  app.add_option("--rounds", a->rounds, "With --grid: run the grid this many times, every plan once per round, and "
                 "judge each plan on its median round (the spread is reported)")
      ->capture_default_str()->check(CLI::Range(1, 20))->needs("--grid");
  app.add_option("--grid-plans", a->grid_plans, "With --grid: run only these grid plans (g01 ... g14)")
      ->delimiter(',')->needs("--grid")
      ->check(CLI::IsMember(grid_labels()));
  return [a, &globals] { return run_autopilot(*a, globals); };
}

}  // namespace zeroplan::cli
