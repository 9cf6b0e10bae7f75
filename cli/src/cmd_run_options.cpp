// `zeroplan run`'s options checked into the executor's RunOptions, in the launcher before any rank starts
// and again in each rank.
#include "cmd_run.h"

#include <fmt/core.h>

#include <filesystem>

#include "model_args.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/pipeline.h"

namespace zeroplan::cli {

exec::RunOptions run_options(const RunArgs& a, const Globals& g) {
  exec::RunOptions o;
  o.model = a.model;
  o.preset = a.preset;
  o.model_options = parse_key_values(a.model_opts, "--opt");
  // A built-in model's options checked here, in the launcher, before any rank builds it (layers=0 was
  // refused by every rank, exit 3).
  if (a.torchscript.empty()) zoo::check_options(o.model, o.preset, o.model_options);
  o.torchscript = a.torchscript;
  o.input_shape = a.input_shape;
  o.script_task = a.task;
  if (!a.torchscript.empty() && a.input_shape.empty())
    throw ExitError(kBadInput, "--torchscript needs --input-shape (one sample, without the batch dimension)");
  o.plan = plan_from_args(a.plan);
  if (o.plan.pipeline_stages > 1 && o.plan.pipeline.balance.mode != PipelineBalance::Mode::units) {
    if (a.profile.empty())
      throw ExitError(kBadInput, fmt::format("pipeline_stages {} with pipeline.balance by {}: give the model's profile "
                                             "(--profile FILE, the one simulate read) or the units per stage "
                                             "(--set pipeline.balance=[n0,n1,...])",
                                             o.plan.pipeline_stages,
                                             o.plan.pipeline.balance.mode == PipelineBalance::Mode::time ? "time" : "memory"));
    const auto profile = read_document<ModelProfile>(a.profile);
    // A built-in model's profile names it (source "zoo:<model>/<preset>"): another model's profile with as
    // many units would balance the stages by the wrong times.
    if (a.torchscript.empty() && profile.source.rfind("zoo:", 0) == 0) {
      // Without a preset any preset of the model matches (the model's default is the profile's to name).
      const std::string want = zoo::profile_source(o.model, o.preset);
      const std::string got = o.preset.empty() ? profile.source.substr(0, profile.source.find('/')) : profile.source;
      if (got != want)
        throw ExitError(kBadInput, fmt::format("--profile {}: a profile of {}, not of this run's model {}", a.profile,
                                               profile.source, want));
    }
    validate(o.plan, profile);
    o.plan.pipeline.balance.units = pipeline_balance(o.plan, profile);
    o.plan.pipeline.balance.mode = PipelineBalance::Mode::units;
  }
  // What the executor does not run (16-bit LocalSGD, AdaScale with loss scaling, ...): refused here, before
  // any rank starts (every rank refused it, exit 3).
  try {
    exec::check_plan_runs(o.plan);
  } catch (const exec::ExecError& e) {
    throw ExitError(kBadInput, e.what());
  }
  o.steps = a.steps;
  o.warmup_steps = a.warmup;
  check_device(a.device);  // before any rank: an unknown device or a GPU this machine lacks
  o.device = a.device;
  o.device_memory_limit_bytes = a.device_memory_limit;
  o.trace_path = a.trace;
  o.progress = a.progress && !g.quiet;
  o.threads = a.threads;
  o.ranks_per_node = a.ranks_per_node;
  if (o.warmup_steps >= o.steps)
    throw ExitError(kBadInput, fmt::format("--warmup {} must be below --steps {}", o.warmup_steps, o.steps));
  o.checkpoint_dir = a.checkpoint_dir;
  o.checkpoint_every = a.checkpoint_every;
  o.checkpoint_keep = a.checkpoint_keep;
  if (o.checkpoint_keep > 0 && o.checkpoint_dir.empty())
    throw ExitError(kBadInput, fmt::format("--checkpoint-keep {} needs --checkpoint-dir", o.checkpoint_keep));
  o.resume_dir = a.resume;
  o.resume_other_run = a.resume_other_run;
  if (o.resume_other_run && o.resume_dir.empty()) throw ExitError(kBadInput, "--resume-other-run needs --resume");
  if (o.checkpoint_every > 0 && o.checkpoint_dir.empty())
    throw ExitError(kBadInput, fmt::format("--checkpoint-every {} needs --checkpoint-dir", o.checkpoint_every));
  if (const std::string why = exec::checkpoint_refusal(o); !why.empty())
    throw ExitError(kBadInput, "checkpoints: " + why);
  if (!o.checkpoint_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.checkpoint_dir, ec);
    if (!std::filesystem::is_directory(o.checkpoint_dir))
      throw ExitError(kBadInput, fmt::format("--checkpoint-dir {}: not a folder that can be created ({})", o.checkpoint_dir,
                                             ec ? ec.message() : "a file is in the way"));
  }
  if (!o.resume_dir.empty() && exec::newest_checkpoint(o.resume_dir) < 0)
    throw ExitError(kBadInput, fmt::format("--resume {}: no checkpoint there (no step-<N>/manifest.json)", o.resume_dir));
  if (!o.resume_dir.empty() && !o.resume_other_run) {
    if (const std::string why = exec::other_run(o.resume_dir, o.plan); !why.empty()) throw ExitError(kBadInput, why);
  }
  return o;
}
}  // namespace zeroplan::cli
