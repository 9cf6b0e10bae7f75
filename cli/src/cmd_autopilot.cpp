// zeroplan autopilot: the whole loop on this machine in one command. Profile a built-in model, probe
// the machine (or reuse a fresh probe), tune under a device-memory budget that the default DDP plan
// does not fit, run the top plans and the default for real on local ranks with that budget enforced,
// compare each with its prediction, and write one report (Markdown and self-contained HTML). This file
// orchestrates: the runs, the grid's fidelity and the report are in autopilot_*.cpp (autopilot.h).
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "autopilot.h"
#include "cli.h"
#include "model_args.h"
#include "zeroplan/exec/probe.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/profiles/knobs.h"
#include "zeroplan/profiles/profiler.h"
#include "zeroplan/profiles/zoo.h"
#include "zeroplan/sim/simulate.h"
#include "zeroplan/tuner/constraints.h"
#include "zeroplan/tuner/report.h"
#include "zeroplan/tuner/tune.h"

namespace zeroplan::cli {
namespace autopilot {
namespace {

// The built-in default: a GPT sized so that a step takes a fraction of a second on 2 CPU cores while
// parameters, optimizer state and activations all matter for memory.
const zoo::Options kDefaultGpt = {{"layers", "4"}, {"hidden", "256"}, {"heads", "4"}, {"seq", "128"}, {"vocab", "8192"}};

// 1. The model's profile, with the threads each rank will have.
// `dtype`: the parameters' and activations' (a 16-bit grid plan is predicted from a profile at its dtype,
// written as model_profile_<dtype>.json).
ModelProfile profile_step(const Args& a, const Globals& g, const zoo::Options& overrides, const fs::path& out,
                          const std::string& dtype = "fp32") {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::string model_name = !a.python.spec.empty() ? a.python.spec : a.torchscript.empty() ? a.model : a.torchscript;
  say(g, fmt::format("{}profiling {} {} {}({} thread(s) per rank and {} ranks computing at once, as the runs will have)",
                     dtype == "fp32" ? "1/5 " : "", model_name, a.preset, dtype == "fp32" ? "" : "in " + dtype + " ",
                     std::max(1, cores / a.nproc), a.profile_concurrent_ranks > 0 ? a.profile_concurrent_ranks : a.nproc));
  if (!a.torchscript.empty() && a.input_shape.empty())
    throw ExitError(kBadInput, "--torchscript needs --input-shape (one sample, without the batch dimension)");
  ProfileOptions po;
  const int per_rank = a.global_batch / a.nproc;
  po.batch = per_rank;
  po.batches.clear();
  for (int b = 1; b <= per_rank; b *= 2) po.batches.push_back(b);
  if (po.batches.size() < 2) po.batches = {per_rank, 2 * per_rank};
  po.threads = std::max(1, cores / a.nproc);
  po.dtype = dtype;
  // More rounds than profile's default: the runs are judged against these times within a few percent.
  po.repeats = 11;
  // Every unit timed with the run's local ranks computing it at once.
  po.concurrent_ranks = a.profile_concurrent_ranks > 0 ? a.profile_concurrent_ranks : a.nproc;
  ModelProfile profile;
  if (!a.python.spec.empty()) {
    profile = profile_python(a.python, po);
  } else {
    zoo::Model model = a.torchscript.empty() ? zoo::build_model(a.model, a.preset, overrides, 0)
                                             : zoo::load_torchscript(a.torchscript, a.input_shape, 0, a.task);
    profile = profile_model(model, po);
  }
  write_document(out / (dtype == "fp32" ? std::string("model_profile.json") : "model_profile_" + dtype + ".json"), profile);
  return profile;
}

// 2. The cluster: --cluster, a fresh probe of this machine, or a new probe (cached for the next run).
ClusterProfile cluster_step(const Args& a, const Globals& g, const fs::path& out) {
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
  return cluster;
}

// 4b. The fidelity grid, no budget. Rounds run every plan once each, so a slow spell of the machine
// falls on all plans alike; each plan is then judged on its median round.
std::vector<Trial> grid_step(const Args& a, const Globals& g, const RunSetup& setup, const zoo::Options& overrides,
                             const fs::path& out, std::map<std::string, ModelProfile>& at_dtype) {
  std::vector<GridPlan> plans = fidelity_grid(a.nproc, a.global_batch);
  if (!a.grid_plans.empty()) {
    std::erase_if(plans, [&](const GridPlan& p) {
      return std::find(a.grid_plans.begin(), a.grid_plans.end(), p.label) == a.grid_plans.end();
    });
  }
  const ClusterProfile per_rank = one_device_per_node(setup.cluster, a.nproc);  // LocalSGD rows
  // 16-bit rows: predicted from profiles at their dtype, once each (`at_dtype` holds those taken already).
  for (const GridPlan& p : plans) {
    const std::string& d = p.plan.precision.compute_dtype;
    if (d != "fp32" && !at_dtype.contains(d)) at_dtype.emplace(d, profile_step(a, g, overrides, out, d));
  }
  std::vector<std::vector<Trial>> rounds(plans.size());
  for (int r = 0; r < a.rounds; ++r) {
    if (a.rounds > 1) say(g, fmt::format("4/5 grid round {} of {}", r + 1, a.rounds));
    for (std::size_t i = 0; i < plans.size(); ++i) {
      // A pipeline runs the units per stage the simulator balanced.
      const Plan& plan = plans[i].plan;
      Trial t = make_trial(plans[i].label, plan, plan.pipeline_stages > 1 ? sim::simulate(setup.profile, setup.cluster, plan) : Prediction{});
      const fs::path dir = a.rounds > 1 ? out / "grid" / t.label / fmt::format("round{}", r + 1) : out / "grid" / t.label;
      const std::string& dtype = plans[i].plan.precision.compute_dtype;
      if (plans[i].rank_per_node) {
        run_trial(t, dir, RunSetup{setup.a, setup.g, setup.profile, per_rank, setup.opts, 1}, 0);
      } else if (dtype != "fp32") {
        run_trial(t, dir, RunSetup{setup.a, setup.g, at_dtype.at(dtype), setup.cluster, setup.opts}, 0);
      } else {
        run_trial(t, dir, setup, 0);
      }
      rounds[i].push_back(std::move(t));
    }
  }
  std::vector<Trial> grid;
  for (auto& r : rounds) grid.push_back(median_round(std::move(r)));
  return grid;
}

// The output folder (a dated one when none is given), made once every option that can be checked is,
// before any profile or probe starts.
fs::path prepare_output(Args& a, const Globals& g) {
  if (a.output_dir.empty()) {
    std::time_t now = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    a.output_dir = std::string("autopilot-") + stamp;
  }
  const fs::path out = a.output_dir;
  // Everything that can be checked is, before the folder is made and any profile or probe starts.
  if (a.nproc < 2) throw ExitError(kBadInput, fmt::format("--nproc {} must be at least 2", a.nproc));
  if (a.global_batch % a.nproc != 0)
    throw ExitError(kBadInput, fmt::format("--global-batch {} is not a multiple of --nproc {}", a.global_batch, a.nproc));
  if (a.warmup >= a.steps)
    throw ExitError(kBadInput, fmt::format("--warmup {} must be below --steps {}", a.warmup, a.steps));
  if (!a.cluster.empty()) (void)resolve_cluster(a.cluster);  // a bad file is one line now, not after the profile
  fs::create_directories(out);
  say(g, fmt::format("output folder: {}", out.string()));
  return out;
}

int run_autopilot(Args& a, const Globals& g) {
  const auto started = std::chrono::steady_clock::now();
  const fs::path out = prepare_output(a, g);

  // The built-in default GPT's options, unless a model of the user's is given (its own file says its shape).
  const bool own_model = !a.python.spec.empty() || !a.torchscript.empty();
  zoo::Options overrides =
      !own_model && a.preset.empty() && a.model == "gpt" && a.model_opts.empty() ? kDefaultGpt : zoo::Options{};
  for (auto& [k, v] : parse_key_values(a.model_opts, "--opt")) overrides[k] = v;
  const std::string model_name = !a.python.spec.empty() ? a.python.spec : a.torchscript.empty() ? a.model : a.torchscript;
  // A Python model runs in its own forward (zeroplan.wrap): pipelines and OffloadModel need the model as a
  // chain of units, so the tuner does not propose them; it is profiled at fp32 (its captured inputs are
  // fp32), so precision stays fp32.
  if (!a.python.spec.empty()) {
    std::string kept;
    for (const auto& k : tuner::parse_knobs(a.knobs))
      if (k != "precision" && k.find("pipeline") == std::string::npos && k.find("offload_model") == std::string::npos)
        kept += (kept.empty() ? "" : ",") + k;
    a.knobs = kept;
  }
  ModelProfile profile = profile_step(a, g, overrides, out);
  // A 16-bit plan is predicted from a profile at its dtype (its loss stays fp32, which scaling the fp32
  // profile would halve), taken once per dtype. When the tuner may vary the precision, both 16-bit dtypes
  // are profiled first and their unit times recorded in the profile it tunes with (times_at_dtype): on a
  // CPU the ratio of GEMM peaks says little about a whole unit (the 2-core machine's AMX runs bf16 GEMMs
  // 6.5x faster than fp32 ones; its layer norms, softmax and gradient adds do not speed up).
  std::map<std::string, ModelProfile> at_dtype;
  auto profile_for = [&](const Plan& p) -> const ModelProfile& {
    const std::string& d = p.precision.compute_dtype;
    if (d == "fp32") return profile;
    if (!at_dtype.contains(d)) at_dtype.emplace(d, profile_step(a, g, overrides, out, d));
    return at_dtype.at(d);
  };
  if (a.knobs.find("precision") != std::string::npos && profile.dtype == "fp32") {
    for (const std::string d : {"bf16", "fp16"}) {
      Plan p;
      p.precision.compute_dtype = d;
      add_times_at_dtype(profile, profile_for(p));
    }
    write_document(out / "model_profile.json", profile);
  }
  const ClusterProfile cluster = cluster_step(a, g, out);

  // 3. The budget: the default plan must not fit.
  Plan ddp = Plan::default_ddp(a.nproc, a.global_batch);
  Prediction ddp_pred = sim::simulate(profile, cluster, ddp);
  std::int64_t budget = a.budget_bytes > 0 ? a.budget_bytes
                                           : static_cast<std::int64_t>(a.budget_fraction * double(ddp_pred.device.total_bytes()));
  say(g, fmt::format("3/5 device budget {} per rank (the default DDP plan is predicted to need {})", mib(budget),
                     mib(ddp_pred.device.total_bytes())));
  ClusterProfile budgeted = cluster;
  budgeted.device.mem_bytes = budget;
  budgeted.provenance["device.mem_bytes"] = Provenance{"estimate", "zeroplan autopilot budget"};

  tuner::TuneConstraints constraints;
  constraints.set_global_batch(a.global_batch).set_world_size(a.nproc).set_nodes(1).set_device_headroom_fraction(a.headroom);
  constraints.knobs = tuner::parse_knobs(a.knobs);
  constraints.allow_approximate_averaging = a.allow_approximate_averaging;
  constraints.runnable = true;  // it runs what it picks: none of the executor's refusals (knobs.h run_rules)
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
    run_trial(t, out / (t.label == "default" ? std::string("default") : fmt::format("plan{}", n)),
              RunSetup{a, g, profile_for(t.plan), budgeted, opts}, budget);
  }
  std::optional<PriceRuns> price;
  if (a.allow_approximate_averaging) price = price_step(RunSetup{a, g, profile, cluster, opts}, out);
  const std::vector<Trial> grid = a.grid ? grid_step(a, g, setup, overrides, out, at_dtype) : std::vector<Trial>{};

  // 5. The report.
  say(g, "5/5 writing the report");
  std::vector<tuner::report::Block> fidelity;
  if (a.grid) {
    std::optional<CalibrationInput> cal;
    if (a.calibrate) cal.emplace(CalibrationInput{profile, budgeted, out});
    fidelity = fidelity_section(grid, out, cal);
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const std::string md = write_report(ReportInput{.model = model_name,
                                                  .model_opts = opts.empty() ? a.preset : opts,
                                                  .params = profile.total_params(),
                                                  .nproc = a.nproc,
                                                  .gloo = tuned.ranking.front().prediction.plan.world_size > 1,
                                                  .global_batch = a.global_batch,
                                                  .cluster = cluster.name,
                                                  .cores = cluster.host.cores,
                                                  .budget_bytes = budget,
                                                  .headroom = a.headroom,
                                                  .default_need_bytes = ddp_pred.device.total_bytes(),
                                                  .trials = trials,
                                                  .grid = grid,
                                                  .fidelity = std::move(fidelity),
                                                  .price = std::move(price),
                                                  .elapsed_s = elapsed},
                                      out);
  if (!g.quiet) fmt::print(stderr, "\n{}\nreport: {} and {}\n", md, (out / "report.md").string(), (out / "report.html").string());
  return kOk;
}

}  // namespace
}  // namespace autopilot

Action add_autopilot(CLI::App& app, const Globals& globals) {
  auto a = std::make_shared<autopilot::Args>();
  app.add_option("--model", a->model, "Built-in model")->capture_default_str();
  app.add_option("--preset", a->preset, "Preset of the model");
  app.add_option("--opt", a->model_opts, "Model option key=value (default gpt: layers=4,hidden=256,heads=4,seq=128,vocab=8192)");
  app.add_option("--python", a->python.spec,
                 "Your own PyTorch model, FILE.py:FACTORY (profiled, tuned, and its plans run in the model's own forward "
                 "by zeroplan.wrap)");
  app.add_option("--units", a->python.policy, "--python: auto, or comma-separated unit classes or module names")
      ->capture_default_str();
  add_torchscript_options(app, a->torchscript, a->input_shape, a->task);
  app.add_option("--cluster", a->cluster, "Use this ClusterProfile instead of probing the machine");
  app.add_option("--budget-bytes", a->budget_bytes, "Device memory per rank (default: a share of the default plan's need)");
  app.add_option("--budget-fraction", a->budget_fraction, "Budget as a share of the default plan's predicted peak")
      ->capture_default_str()->check(number_in(0, 1, true));
  app.add_option("--headroom", a->headroom, "Share of the budget the tuner keeps free for what the prediction misses "
                 "(the runs get the whole budget)")
      ->capture_default_str()->check(number_in(0, 0.99));
  app.add_option("--verify", a->verify, "Top plans to run for real")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--nproc", a->nproc, "Local ranks")->capture_default_str();
  app.add_option("--profile-concurrent-ranks", a->profile_concurrent_ranks,
                 "Ranks computing each unit at once while profiling (default: --nproc, as the runs; 1: each unit "
                 "alone, as before 2026-11-25)")
      ->check(CLI::Range(1, 256));
  app.add_option("--global-batch", a->global_batch, "Samples per optimizer step")->capture_default_str()->check(positive());
  app.add_option("--steps", a->steps, "Steps per run, warm-up included")->capture_default_str()->check(positive());
  app.add_option("--warmup", a->warmup, "Warm-up steps per run")->capture_default_str()->check(non_negative());
  app.add_option("--knobs", a->knobs, "Knobs the tuner may vary (those the executor runs)")->capture_default_str();
  app.add_option("--probe-max-age-h", a->probe_max_age_h, "Reuse a probe younger than this (hours)")->capture_default_str();
  app.add_option("-o,--output-dir", a->output_dir, "Output folder (default: autopilot-<date>-<time>)")->check(output_folder());
  app.add_flag("--allow-approximate-averaging", a->allow_approximate_averaging,
               "Let the tuner vary LocalSGD/SlowMo/AdaScale, and run the default plan beside the same plan with "
               "LocalSGD (one rank per node) to show what the speed costs in loss");
  app.add_flag("--grid", a->grid, "Also run the fidelity grid (14 plans over every knob, no budget) and report "
               "median and maximum errors and the rank correlation");
  app.add_flag("--calibrate", a->calibrate, "With --grid: fit compute and collective time factors on the odd-numbered "
               "grid plans and judge the calibrated predictions on the even-numbered ones")->needs("--grid");
  app.add_option("--rounds", a->rounds, "With --grid: run the grid this many times, every plan once per round, and "
                 "judge each plan on its median round (the spread is reported)")
      ->capture_default_str()->check(CLI::Range(1, 20))->needs("--grid");
  app.add_option("--grid-plans", a->grid_plans, "With --grid: run only these grid plans (g01 ... g24)")
      ->delimiter(',')->needs("--grid")
      ->check(CLI::IsMember(autopilot::grid_labels()));
  return [a, &globals] { return autopilot::run_autopilot(*a, globals); };
}

}  // namespace zeroplan::cli
