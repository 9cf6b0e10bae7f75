// zeroplan run: train with a Plan on real ranks and measure it -> RunRecord.
//
// Three ways in, one code path for the ranks:
//   zeroplan run --nproc 2 ...                      this process launches 2 local ranks, gathers their
//                                                   results from files and writes the RunRecord;
//   torchrun --no-python --nproc-per-node 2 zeroplan run ...   each rank joins torchrun's store; rank 0
//                                                   gathers the results through the store;
//   zeroplan run ...                                one process, world size 1.
#include <fmt/core.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <c10/util/Logging.h>
#include <csignal>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli.h"
#include "cmd_run.h"
#include "model_args.h"
#include "plan_args.h"
#include "python_bridge.h"
#include "zeroplan/exec/communicator.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/exec/launcher.h"
#include "zeroplan/exec/local_communicator.h"
#include "zeroplan/exec/rendezvous.h"
#include "zeroplan/exec/run.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/profiles/zoo.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/pipeline.h"

namespace zeroplan::cli {
namespace {


void print_record(const RunRecord& r) {
  fmt::print(stderr, "run: {} on {} rank(s) ({}), {} steps ({} warm-up)\n", r.model, r.plan.world_size,
             r.environment.backend, r.step_times_s.size(), r.warmup_steps);
  fmt::print(stderr, "  step time  median {:.6f} s   p10 {:.6f} s   p90 {:.6f} s\n", r.step_time_median_s,
             r.step_time_p10_s, r.step_time_p90_s);
  for (const auto& [phase, s] : r.phase_times_s) fmt::print(stderr, "  phase {:<22} {:.6f} s/step\n", phase, s);
  for (const auto& p : r.peaks)
    fmt::print(stderr, "  rank {} peak device {:>12} B   host {:>12} B{}\n", p.rank, p.device_peak_bytes, p.host_peak_bytes,
               p.device_peak_at.empty() ? "" : "   device peak in " + p.device_peak_at);
  if (!r.offloaded_activations.empty()) {
    std::int64_t bytes = 0, sent = 0;
    int tensors = 0, offloaded = 0;
    for (const auto& u : r.offloaded_activations) {
      bytes += u.bytes;
      sent += u.offloaded_bytes;
      tensors += u.tensors;
      offloaded += u.offloaded;
    }
    fmt::print(stderr, "  activation offload: {} of {} saved tensors to the host per microbatch, {} of {} B ({:.1f}%)\n",
               offloaded, tensors, sent, bytes, bytes > 0 ? 100.0 * static_cast<double>(sent) / static_cast<double>(bytes) : 0.0);
  }
  if (!r.losses.empty()) fmt::print(stderr, "  loss {:.6f} -> {:.6f}\n", r.losses.front(), r.losses.back());
  for (const auto& f : r.fallbacks) fmt::print(stderr, "  fallback: {}\n", f);
}

void finish(const RunRecord& record, const RunArgs& a, const Globals& g) {
  if (!g.quiet) print_record(record);
  if (!a.output.empty()) write_document(a.output, record);
  if (g.json) fmt::print("{}", to_json_string(record));
}

// The ranks' results, from the files launch_local's ranks wrote.
std::vector<exec::RunResult> gather_results(const exec::LaunchResult& result, int nproc) {
  std::vector<exec::RunResult> ranks;
  for (int r = 0; r < nproc; ++r) {
    std::ifstream in(exec::rank_file(result.output_dir, r, ".json"));
    if (!in) throw ExitError(kRunFailed, fmt::format("rank {} finished but wrote no result in {}", r, result.output_dir));
    ranks.push_back(nlohmann::json::parse(in).get<exec::RunResult>());
  }
  return ranks;
}

// The parent of `--nproc N`: launch, watch, gather.
int run_parent(const RunArgs& a, const Globals& g) {
  exec::RunOptions options = run_options(a, g);  // validates everything before any rank starts
  if (!options.torchscript.empty()) {
    exec::build_run_model(options);  // the file, its input shape and its task, checked once here
  } else {
    zoo::resolve_options(options.model, options.preset, options.model_options);
  }
  if (options.plan.world_size != a.nproc)
    throw ExitError(kBadInput, fmt::format("plan world_size {} != --nproc {}", options.plan.world_size, a.nproc));
  if (a.ranks_per_node > 0 && a.nproc % a.ranks_per_node != 0)
    throw ExitError(kBadInput, fmt::format("--ranks-per-node {} does not divide the {} ranks", a.ranks_per_node, a.nproc));
  exec::LaunchOptions lo;
  lo.timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  auto result = exec::launch_local(a.nproc, exec::without_option(a.argv, "--nproc"), lo);
  if (result.exit_code > 128) throw ExitError(result.exit_code, result.message);  // stopped by a signal: 128 + it
  if (result.exit_code != 0) throw ExitError(kRunFailed, result.message);
  finish(exec::merge_results(options, gather_results(result, a.nproc)), a, g);
  return kOk;
}

// `run --python FILE.py:FACTORY`: the user's model trained in its own forward under the plan (the hook
// driver, zeroplan.wrap) on make_batch's samples; each rank is `<venv python> -m zeroplan train`, launched
// and watched as the built-in models' ranks are. Each rank reports its own losses: the record's are their
// mean over the ranks, each rank having trained on its share of the global batch.
int run_python(const RunArgs& a, const Globals& g, const std::string& spec) {
  const std::string exe = python_exe();
  const auto colon = spec.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size())
    throw ExitError(kBadInput, fmt::format("--python {}: expected FILE.py:FACTORY", spec));
  if (!std::filesystem::is_regular_file(spec.substr(0, colon)))
    throw ExitError(kBadInput, fmt::format("--python {}: no file {}", spec, spec.substr(0, colon)));
  if (!a.torchscript.empty() || !a.model_opts.empty() || !a.preset.empty() || !a.trace.empty())
    throw ExitError(kBadInput, "--python takes its model from FILE.py:FACTORY: --torchscript, --preset, --opt and "
                               "--trace are for the built-in models");
  const int nproc = std::max(1, a.nproc);
  RunArgs b = a;
  if (!b.plan.world_size) b.plan.world_size = nproc;
  if (const Plan p = plan_from_args(b.plan); p.pipeline_stages > 1 || p.offload_model.enabled)
    throw ExitError(kNotPossibleHere, fmt::format("--python {}: {} needs the model as a chain of units; a model trained "
                                                  "in its own forward runs every other plan", spec,
                                                  p.pipeline_stages > 1 ? "pipeline_stages" : "offload_model"));
  exec::RunOptions options = run_options(b, g);  // the plan and every option checked before any rank starts
  options.model = spec.substr(colon + 1);
  if (options.plan.world_size != nproc)
    throw ExitError(kBadInput, fmt::format("plan world_size {} != --nproc {}", options.plan.world_size, nproc));
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("zeroplan-run-python-{}", getpid());
  std::filesystem::create_directories(dir);
  const std::string plan_path = (dir / "plan.json").string();
  write_document(plan_path, options.plan);
  std::vector<std::string> argv = {exe, "-m", "zeroplan", "train", "--python", spec, "--plan", plan_path,
                                   "--steps", std::to_string(a.steps), "--warmup", std::to_string(a.warmup),
                                   "--device", a.device};
  const int threads = a.threads > 0 ? a.threads
                      : std::getenv("OMP_NUM_THREADS") != nullptr
                          ? 0
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / nproc);
  if (threads > 0) argv.insert(argv.end(), {"--threads", std::to_string(threads)});
  if (!a.checkpoint_dir.empty()) argv.insert(argv.end(), {"--checkpoint-dir", a.checkpoint_dir});
  if (a.checkpoint_every > 0) argv.insert(argv.end(), {"--checkpoint-every", std::to_string(a.checkpoint_every)});
  if (a.checkpoint_keep > 0) argv.insert(argv.end(), {"--checkpoint-keep", std::to_string(a.checkpoint_keep)});
  if (!a.resume.empty()) argv.insert(argv.end(), {"--resume", a.resume});
  if (a.resume_other_run) argv.push_back("--resume-other-run");
  if (a.device_memory_limit > 0) argv.insert(argv.end(), {"--device-memory-limit", std::to_string(a.device_memory_limit)});
  exec::LaunchOptions lo;
  lo.executable = exe;
  lo.env = python_env();
  lo.timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  auto result = exec::launch_local(nproc, argv, lo);
  std::filesystem::remove_all(dir);
  if (result.exit_code > 128) throw ExitError(result.exit_code, result.message);
  if (result.exit_code != 0) {
    // A rank that refused its input (a bad factory, a plan the model cannot run) says so with its exit code.
    int code = kRunFailed;
    for (const auto& r : result.ranks)
      if (r.exit_code == kBadInput || r.exit_code == kNotPossibleHere) code = r.exit_code;
    throw ExitError(code, result.message);
  }
  std::vector<exec::RunResult> ranks = gather_results(result, nproc);
  for (std::size_t s = 0; s < ranks[0].losses.size(); ++s) {
    double sum = 0;
    for (const auto& r : ranks) sum += r.losses.at(s);
    for (auto& r : ranks) r.losses[s] = sum / static_cast<double>(nproc);
  }
  finish(exec::merge_results(options, ranks), a, g);
  return kOk;
}

// A rank: under launch_local, torchrun, Slurm, or alone.
// A rank started by a launcher (`run --nproc`, torchrun's agent) dies with it: a launcher killed by SIGKILL
// (or any signal it cannot pass on) leaves no orphan training on and writing checkpoints into a folder a
// restarted job uses. SIGKILL, as the launcher's own escalation does; every file a rank writes is replaced
// atomically, so nothing written is lost. A parent that is already gone ends the rank at once.
void die_with_launcher() {
  if (std::getenv("RANK") == nullptr) return;  // not launched as a rank
  // The launcher's pid (zeroplan's launcher says it; under torchrun the parent now): a launcher killed
  // while this rank was still starting left it with another parent already.
  const char* launcher = std::getenv("ZEROPLAN_LAUNCHER_PID");
  const pid_t parent = launcher != nullptr ? static_cast<pid_t>(std::atol(launcher)) : getppid();
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) return;
  if (getppid() != parent || getppid() == 1) std::_Exit(128 + SIGKILL);
}

int run_rank(RunArgs a, const Globals& g) {
  die_with_launcher();
  exec::RankContext ctx = exec::rank_context_from_env();
  // Like torchrun, never oversubscribe the cores: ranks on one machine share them.
  if (a.threads == 0 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    a.threads = std::max(1, cores / std::max(1, ctx.local_world_size));
  }
  // Without a plan file or --world-size, the plan spans the ranks that were launched.
  if (a.plan.file.empty() && !a.plan.world_size) a.plan.world_size = ctx.world_size;
  if (a.ranks_per_node == 0) a.ranks_per_node = std::max(1, ctx.local_world_size);
  if (ctx.world_size % a.ranks_per_node != 0)
    throw ExitError(kBadInput, fmt::format("--ranks-per-node {} does not divide the {} ranks", a.ranks_per_node,
                                           ctx.world_size));
  exec::RunOptions options = run_options(a, g);
  if (options.plan.world_size != ctx.world_size)
    throw ExitError(kBadInput, fmt::format("plan world_size {} != launched world size {} ({})",
                                           options.plan.world_size, ctx.world_size, ctx.launcher));
  if (ctx.world_size == 1 && !ctx.agent_store) {
    exec::LocalCommunicator comm;
    auto result = exec::run_rank(options, comm);
    finish(exec::merge_results(options, {result}), a, g);
    return kOk;
  }
  exec::RendezvousOptions ro;
  ro.timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  ro.device = a.device.rfind("cuda", 0) == 0 ? "cuda" : "cpu";
  // torch's c10d logs a warning with its backtrace on every failed store call (a dead launcher's store: 46
  // lines per rank); the rank says it in one line instead. TORCH_CPP_LOG_LEVEL, when set, decides.
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = c10::GLOG_ERROR;
  auto session = exec::join(ctx, ro);
  try {
    options.progress = options.progress && ctx.rank == 0;
    auto result = exec::run_rank(options, session->comm());
    nlohmann::json mine = result;
    if (!ctx.output_dir.empty()) {
      // launch_local gathers the files.
      std::ofstream out(exec::rank_file(ctx.output_dir, ctx.rank, ".json"));
      out << mine.dump();
    } else {
      // torchrun, Slurm: rank 0 gathers through the store and writes the record.
      auto store = session->store();
      std::string text = mine.dump();
      store->set("zeroplan/result/" + std::to_string(ctx.rank), std::vector<uint8_t>(text.begin(), text.end()));
      if (ctx.rank == 0) {
        std::vector<exec::RunResult> ranks;
        for (int r = 0; r < ctx.world_size; ++r) {
          auto bytes = store->get("zeroplan/result/" + std::to_string(r));
          ranks.push_back(nlohmann::json::parse(std::string(bytes.begin(), bytes.end())).get<exec::RunResult>());
        }
        finish(exec::merge_results(options, ranks), a, g);
      }
    }
    session->finish();
  } catch (const std::exception& e) {
    session->fail(zoo::torch_cause(e));  // one line: never torch's backtrace
    throw;
  }
  return kOk;
}

}  // namespace

Action add_run(CLI::App& app, const Globals& globals) {
  auto a = std::make_shared<RunArgs>();
  app.add_option("--model", a->model, "Built-in model")->capture_default_str();
  app.add_option("--preset", a->preset, "Preset of the model, e.g. gpt2-tiny");
  app.add_option("--profile", a->profile,
                 "ModelProfile of the model: splits a pipelined plan's units by its balance (time or memory), as simulate does")
      ->check(CLI::ExistingFile);
  app.add_option("--opt", a->model_opts, "Model option key=value, e.g. --opt layers=4");
  add_torchscript_options(app, a->torchscript, a->input_shape, a->task);
  app.add_option("--plan", a->plan.file, "Plan file (default: DDP, no offload)")->check(CLI::ExistingFile);
  app.add_option("--set", a->plan.sets, "Plan field key=value, dotted (offload.params=true); repeatable");
  app.add_option("--world-size", a->plan.world_size, "Data-parallel ranks (default: the plan's, or --nproc)")
      ->check(number_in(1, 1 << 20));
  app.add_option("--global-batch", a->plan.global_batch, "Samples per optimizer step");
  app.add_option("--nproc", a->nproc, "Start this many local ranks (Gloo on 127.0.0.1) and gather their results")
      ->check(positive());
  app.add_option("--steps", a->steps, "Steps, warm-up included")->capture_default_str()->check(positive());
  app.add_option("--warmup", a->warmup, "Warm-up steps excluded from the statistics")->capture_default_str()
      ->check(non_negative());
  app.add_option("--device", a->device, "cpu | cuda")->capture_default_str();
  app.add_option("--device-memory-limit", a->device_memory_limit,
                 "Bytes the device pool may hold (CPU): past it the run fails as a GPU would")
      ->check(non_negative());
  // At least 2 s: the ranks beat every second, so a shorter timeout calls every rank dead (0.001 did).
  app.add_option("--timeout", a->timeout_s, "Seconds before a silent or dead rank ends the run (at least 2: the "
                 "ranks' heartbeat is every second)")
      ->capture_default_str()
      ->check(number_in(2, 1e6));
  app.add_option("--trace", a->trace, "Chrome trace per rank (-rank<r> is added before .json)")->check(output_path());
  app.add_flag("--progress", a->progress, "Step, loss and step time on stderr");
  app.add_option("--threads", a->threads, "Intra-op threads per rank (default: OMP_NUM_THREADS, else cores / local ranks)")
      ->check(threads_option());
  app.add_option("--ranks-per-node", a->ranks_per_node,
                 "Ranks that share a node, numbered node by node (default: LOCAL_WORLD_SIZE); LocalSGD reduces "
                 "gradients within a node and averages parameters across nodes: 1 makes every rank a node")
      ->check(non_negative());
  app.add_option("--checkpoint-dir", a->checkpoint_dir,
                 "Save checkpoints here (each rank its shard, then a manifest): every --checkpoint-every steps "
                 "and after the last step");
  app.add_option("--checkpoint-every", a->checkpoint_every,
                 "Steps between checkpoints (counted from the training's step 0, across resumes)")
      ->check(non_negative());
  app.add_option("--checkpoint-keep", a->checkpoint_keep,
                 "Keep the newest N checkpoints of --checkpoint-dir, removing older ones after each save (0: all); "
                 "a save interrupted earlier (a step folder without its manifest) is removed at the start")
      ->check(number_in(0, 1e9));
  app.add_option("--resume", a->resume,
                 "Continue from the newest checkpoint in this folder (its step, states and data order; at stages "
                 "1-3 on any number of ranks); refused in one line when it is another run's (its model, seed or "
                 "global batch differ)");
  app.add_flag("--resume-other-run", a->resume_other_run,
               "Resume a checkpoint of another run (another model name, seed or global batch) all the same");
  app.add_option("-o,--output", a->output, "Write the RunRecord here")->check(output_path());
  auto python = std::make_shared<std::string>();
  app.add_option("--python", *python, "Your own PyTorch model, FILE.py:FACTORY (model, make_batch, loss_fn): trained "
                 "in its own forward under the plan (zeroplan.wrap) on make_batch's samples");
  return [a, &app, &globals, python] {
    a->argv = globals.argv;
    (void)app;
    if (a->nproc > 0 && !a->plan.world_size) a->plan.world_size = a->nproc;
    if (!python->empty()) return run_python(*a, globals, *python);
    return a->nproc > 0 ? run_parent(*a, globals) : run_rank(*a, globals);  // errors: main.cpp's one map
  };
}

}  // namespace zeroplan::cli
