// `zeroplan run`'s options (cmd_run.cpp registers and runs them; cmd_run_options.cpp checks them into
// the executor's RunOptions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli.h"
#include "plan_args.h"
#include "zeroplan/exec/run.h"
#include "zeroplan/profiles/zoo.h"

namespace zeroplan::cli {

struct RunArgs {
  std::string model = "gpt", preset, output, trace;
  std::string profile;  // ModelProfile: resolves a time or memory pipeline balance into units per stage
  std::vector<std::string> model_opts;
  std::string torchscript;
  std::vector<int64_t> input_shape;
  zoo::ScriptTask task;
  PlanArgs plan;
  int nproc = 0;
  int steps = 10;
  int warmup = 1;
  std::string device = "cpu";
  std::int64_t device_memory_limit = 0;
  double timeout_s = 300;
  bool progress = false;
  int threads = 0;                // 0: OMP_NUM_THREADS if set, else the cores shared by the local ranks
  int ranks_per_node = 0;         // 0: the launcher's LOCAL_WORLD_SIZE
  std::string checkpoint_dir, resume;
  bool resume_other_run = false;
  int checkpoint_every = 0;
  int checkpoint_keep = 0;
  std::vector<std::string> argv;  // the full command line, for the launcher
};

// The options of one rank (and of the launcher, which checks them before any rank starts): every value in
// range, the plan valid and runnable by the executor, checkpoints and the resume folder checked (its run
// identity included). Throws ExitError (or SchemaError) in one line.
exec::RunOptions run_options(const RunArgs& a, const Globals& g);

}  // namespace zeroplan::cli
