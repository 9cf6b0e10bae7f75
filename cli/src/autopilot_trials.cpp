// Autopilot's runs: each plan simulated, run for real by a child `zeroplan run` on local ranks,
// compared with its prediction; the fidelity grid's plans; the median of a plan's rounds.
#include <fcntl.h>
#include <fmt/core.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "autopilot.h"
#include "zeroplan/sim/price.h"
#include "model_args.h"
#include "zeroplan/config.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/sim/compare.h"
#include "zeroplan/sim/simulate.h"

extern char** environ;

namespace zeroplan::cli::autopilot {
namespace {

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

}  // namespace

std::string mib(double bytes) { return fmt::format("{:.1f} MiB", bytes / double(1 << 20)); }

void say(const Globals& g, const std::string& line) {
  if (!g.quiet) fmt::print(stderr, "[autopilot] {}\n", line);
}

std::string percent(double v) { return std::isnan(v) ? "n/a" : fmt::format("{:.1f}%", 100 * v); }

std::string describe(const Plan& p) {
  std::string s = fmt::format("stage {}", p.zero_stage);
  if (p.zero_stage == 3) s += p.reshard_after_forward ? ", reshard" : ", no reshard";
  if (p.offload.params) s += ", offload params";
  if (p.offload.grads) s += ", offload grads";
  if (p.offload.optimizer) s += ", offload optimizer";
  if (p.offload.activations_ratio > 0) s += fmt::format(", offload {:.0f}% activations", 100 * p.offload.activations_ratio);
  if (p.checkpointing.mode == Checkpointing::Mode::all) s += ", checkpoint all";
  else if (p.checkpointing.mode == Checkpointing::Mode::units) s += fmt::format(", checkpoint {} units", p.checkpointing.units.size());
  if (p.offload_model.enabled) {
    s += fmt::format(", OffloadModel {} slices{}", p.offload_model.slices,
                     p.offload_model.checkpoint_activation ? " checkpointed" : "");
    if (p.offload_model.microbatches > 1) s += fmt::format(" x {} chunks", p.offload_model.microbatches);
  }
  if (p.pipeline_stages > 1) {
    s += fmt::format(", {} pipeline stages {}", p.pipeline_stages, p.pipeline.schedule);
    if (p.pipeline.schedule == "gpipe" && p.pipeline.checkpoint != "never") s += " checkpoint " + p.pipeline.checkpoint;
  }
  s += fmt::format(", micro batch {} x {}", p.micro_batch, p.microbatches);
  if (p.localsgd()) s += fmt::format(", LocalSGD every {}", p.localsgd_frequency);
  if (p.slowmo()) s += fmt::format(", SlowMo momentum {:g} every {}", p.slowmo_momentum, p.slowmo_frequency);
  if (p.adascale) s += ", AdaScale";
  if (p.precision.param_dtype != "fp32") s += ", " + p.precision.param_dtype;
  return s;
}

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
  // Pipeline stages run with the simulator's balance, as units per stage (the executor has no profile).
  if (plan.pipeline_stages > 1 && plan.pipeline.balance.mode != PipelineBalance::Mode::units &&
      static_cast<int>(prediction.stages.size()) == plan.pipeline_stages) {
    t.plan.pipeline.balance.mode = PipelineBalance::Mode::units;
    t.plan.pipeline.balance.units.clear();
    for (const auto& s : prediction.stages) t.plan.pipeline.balance.units.push_back(s.units);
  }
  t.prediction = prediction;
  return t;
}

DevicePeak device_peak(const RunRecord& r) {
  DevicePeak d;
  for (const auto& p : r.peaks) {
    if (p.device_peak_bytes > d.bytes) d = {p.device_peak_bytes, p.device_peak_at};
  }
  return d;
}

std::vector<GridPlan> fidelity_grid(int nproc, int global_batch) {
  const Plan base = Plan::default_ddp(nproc, global_batch);
  const int per_rank = base.micro_batch;
  std::vector<GridPlan> out;
  auto add = [&](const std::string& label, int stage, int microbatches, auto&& tweak) {
    if (per_rank % microbatches != 0) return;
    Plan p = base;
    p.zero_stage = stage;
    p.reshard_after_forward = stage == 3;
    p.microbatches = microbatches;
    p.micro_batch = per_rank / microbatches;
    tweak(p);
    out.push_back({label, p, p.localsgd()});
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
  // Averaging instead of reducing gradients (each rank its own node): step time is the mean over the
  // period, memory holds SlowMo's slow momentum and previous parameters.
  add("g15", 0, 1, [](Plan& p) { p.localsgd_frequency = 2; });
  add("g16", 0, 1, [](Plan& p) {
    p.localsgd_frequency = 2;
    p.slowmo_frequency = 2;
    p.slowmo_momentum = 0.5;
  });
  // 16-bit parameters, activations and gradients with an fp32 master (predicted from a profile at the
  // dtype: the loss stays fp32, which scaling an fp32 profile would halve).
  auto sixteen = [](const std::string& dtype) {
    return [dtype](Plan& p) {
      p.precision.param_dtype = p.precision.compute_dtype = p.precision.reduce_dtype = dtype;
      p.precision.master_fp32 = true;
      p.precision.loss_scale.mode = dtype == "fp16" ? LossScale::Mode::dynamic : LossScale::Mode::none;
    };
  };
  add("g17", 2, 1, sixteen("bf16"));
  add("g18", 3, 1, sixteen("fp16"));
  // fairscale OffloadModel: the model states on the host, 2 slices visiting the device; then checkpointed
  // slices with the micro batch in 2 chunks.
  auto offload_model = [](int chunks, bool ckpt) {
    return [chunks, ckpt](Plan& p) {
      p.offload_model.enabled = true;
      p.offload_model.slices = 2;
      p.offload_model.microbatches = p.micro_batch % chunks == 0 ? chunks : 1;
      p.offload_model.checkpoint_activation = ckpt;
    };
  };
  add("g19", 0, 1, offload_model(1, false));
  add("g20", 0, 1, offload_model(2, true));
  // Pipelines of 2 stages over 4 microbatches (the data-parallel size halved): GPipe with fairscale Pipe's
  // except_last checkpointing, and 1F1B. Their stages' units come from the prediction (grid_step).
  const int dp = nproc / 2;
  if (nproc % 2 == 0 && global_batch % (dp * 4) == 0) {
    auto pipeline = [dp](const std::string& schedule) {
      return [dp, schedule](Plan& p) {
        p.pipeline_stages = 2;
        p.pipeline.schedule = schedule;
        p.pipeline.checkpoint = schedule == "gpipe" ? "except_last" : "never";
        p.microbatches = 4;
        p.micro_batch = p.global_batch / (dp * 4);
      };
    };
    add("g21", 0, 1, pipeline("gpipe"));
    add("g22", 0, 1, pipeline("1f1b"));
  }
  // Activation offload, one saved tensor at a time: half of them at stage 0; all of them at stage 3 with
  // 2 microbatches, copied back only when each unit's backward starts.
  add("g23", 0, 1, [](Plan& p) { p.offload.activations_ratio = 0.5; });
  add("g24", 3, 2, [](Plan& p) {
    p.offload.activations_ratio = 1;
    p.offload.activations_prefetch_bytes = 0;
  });
  return out;
}

std::vector<std::string> grid_labels() {
  std::vector<std::string> labels;
  for (const GridPlan& g : fidelity_grid(2, 8)) labels.push_back(g.label);  // every row exists at 2 ranks
  return labels;
}

void run_trial(Trial& t, const fs::path& dir, const RunSetup& r, std::int64_t limit) {
  const Args& a = r.a;
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
                                "--warmup", std::to_string(a.warmup), "-o", (dir / "run_record.json").string()};
  // A Python model's run (zeroplan.wrap in its own forward) writes no measured trace.
  if (a.python.spec.empty()) args.insert(args.end(), {"--trace", (dir / "measured_trace.json").string()});
  if (limit > 0) args.insert(args.end(), {"--device-memory-limit", std::to_string(limit)});
  if (r.ranks_per_node > 0) args.insert(args.end(), {"--ranks-per-node", std::to_string(r.ranks_per_node)});
  if (!a.python.spec.empty()) {
    args.insert(args.end(), {"--python", a.python.spec});
  } else if (!a.torchscript.empty()) {
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
                       t.record->step_time_median_s, t.prediction.step_time_s, mib(double(peak)),
                       mib(double(t.prediction.device.peak_bytes))));
}

ClusterProfile one_device_per_node(const ClusterProfile& c, int nproc) {
  ClusterProfile one = c;
  one.devices_per_node = 1;
  one.nodes = nproc;
  return one;
}

PriceRuns price_step(const RunSetup& r, const fs::path& out) {
  const Plan sync = Plan::default_ddp(r.a.nproc, r.a.global_batch);
  Plan local = sync;
  local.localsgd_frequency = 4;
  // Each rank its own node: LocalSGD on one node is DDP (gradients reduced within the node every step).
  const ClusterProfile per_rank = one_device_per_node(r.cluster, r.a.nproc);
  PriceRuns p;
  Trial ts = make_trial("synchronous", sync, Prediction{});
  run_trial(ts, out / "price" / "synchronous", RunSetup{r.a, r.g, r.profile, r.cluster, r.opts}, 0);
  Trial tl = make_trial("localsgd", local, Prediction{});
  run_trial(tl, out / "price" / "localsgd", RunSetup{r.a, r.g, r.profile, per_rank, r.opts, 1}, 0);
  if (!ts.record || !tl.record) {
    p.failure = !ts.record ? "the synchronous run failed: " + ts.failure : "the LocalSGD run failed: " + tl.failure;
    return p;
  }
  try {
    p.price = sim::averaging_price(*tl.record, *ts.record, "price/synchronous/run_record.json");
  } catch (const SchemaError& e) {
    p.failure = e.what();
  }
  return p;
}

}  // namespace zeroplan::cli::autopilot
