// zeroplan: one binary, one subcommand per arrow of the data flow (DESIGN.md). Every error reaches the
// user as one line and a fixed exit code (cli.h), never a backtrace.
#include <fmt/core.h>

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>

#include "cli.h"
#include "zeroplan/config.h"
#include "zeroplan/exec/communicator.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/exec/launcher.h"
#include "zeroplan/exec/probe.h"
#include "zeroplan/exec/rendezvous.h"
#include "zeroplan/sim/errors.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/zoo.h"

namespace {

std::string first_line(const std::string& text) {
  auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

// The one line of a failure, and its exit code. A rank started by `zeroplan run --nproc` hands its line
// to the launcher (the TorchElastic error file the launcher reads) instead of printing it, so the user
// sees the failure once, from the launcher; anything else prints it on stderr.
int fail(const std::string& where, const std::string& message, int code) {
  const char* launcher = std::getenv("ZEROPLAN_LAUNCHER");
  const char* error_file = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (launcher != nullptr && std::string(launcher) == "zeroplan" && error_file != nullptr && *error_file) {
    // The first error a rank wrote (cmd_run's session->fail) is its cause; otherwise this one.
    if (!std::filesystem::exists(error_file)) zeroplan::exec::write_error_file(error_file, message);
    if (std::filesystem::exists(error_file)) return code;
  }
  fmt::print(stderr, "{}: {}\n", where, message);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace zeroplan::cli;
  CLI::App app{"zeroplan: find the memory-saving strategy that fits your model on your cluster, "
               "predict its speed, run it, and compare.",
               "zeroplan"};
  app.set_version_flag("--version", std::string(ZEROPLAN_VERSION) + " (torch " + ZEROPLAN_TORCH_VERSION + ")");
  app.require_subcommand(1);
  app.fallthrough();  // global flags (--json, -q) also after the subcommand
  Globals globals;
  globals.argv.assign(argv, argv + argc);
  app.add_flag("--json", globals.json, "Print the produced document (JSON) on stdout");
  app.add_flag("-q,--quiet", globals.quiet, "No tables or progress on stderr");
  const std::string footer = registry_footer() +
      "\nNew here? Start with `zeroplan autopilot`: it profiles a built-in model, probes this machine, tunes, "
      "runs the best plans on 2 local ranks and compares predicted with measured.\n"
      "Exit codes: 0 ok, 1 bad input, 2 not possible here, 3 run failed.";
  app.footer(footer);

  struct Entry { const char* name; const char* help; Registrar add; };
  const Entry entries[] = {
      {"profile", "Measure a model unit by unit (or derive it analytically) -> ModelProfile", add_profile},
      {"probe", "Measure this machine -> ClusterProfile", add_probe},
      {"simulate", "Simulate one training step of a Plan -> Prediction", add_simulate},
      {"tune", "Search every strategy knob for the fastest plan that fits -> ranked Plans", add_tune},
      {"run", "Train with a Plan on real ranks (c10d: Gloo on CPU, NCCL on CUDA) -> RunRecord", add_run},
      {"compare", "Predicted vs measured -> Comparison", add_compare},
      {"calibrate", "Fit the cluster file's time-model terms to measured runs -> calibrated ClusterProfile", add_calibrate},
      {"autopilot", "Profile, probe, tune, run and compare on this machine in one command", add_autopilot},
      {"plan", "Describe the Plan: --fields lists every knob (range, default, simulate / tune / run)", add_plan},
  };
  Action chosen;
  for (const auto& e : entries) {
    CLI::App* sub = app.add_subcommand(e.name, e.help);
    sub->footer(footer);
    Action action = e.add(*sub, globals);
    sub->callback([&chosen, action] { chosen = action; });
  }

  std::string where = "zeroplan";
  // The one map from error types to exit codes (the table in docs/2-subcommands.md), for every subcommand: ExitError
  // carries its own; a run that started and failed is 3; an input the schema, executor, simulator or
  // rendezvous refuses is 1. Most derived types first.
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      return app.exit(CLI::CallForHelp());
    } catch (const CLI::CallForAllHelp&) {
      return app.exit(CLI::CallForAllHelp());
    } catch (const CLI::CallForVersion& e) {
      return app.exit(e);
    } catch (const CLI::ParseError& e) {
      // Subcommand help comes through here as well.
      if (e.get_exit_code() == 0) return app.exit(e);
      throw ExitError(kBadInput, first_line(e.what()) + " (see zeroplan --help)");
    }
    for (auto* sub : app.get_subcommands()) where = "zeroplan " + sub->get_name();
    return chosen ? chosen() : kBadInput;
  } catch (const ExitError& e) {
    return fail(where, e.what(), e.code());
  } catch (const zeroplan::SchemaError& e) {
    return fail(where, first_line(e.what()), kBadInput);
  } catch (const zeroplan::exec::OutOfDeviceMemory& e) {
    return fail(where, first_line(e.what()), kRunFailed);
  } catch (const zeroplan::exec::UnitFailure& e) {
    return fail(where, first_line(e.what()), kRunFailed);
  } catch (const zeroplan::exec::Diverged& e) {
    return fail(where, first_line(e.what()), kRunFailed);
  } catch (const zeroplan::exec::ProbeError& e) {
    return fail(where, first_line(e.what()), kRunFailed);
  } catch (const zeroplan::exec::ExecError& e) {
    return fail(where, first_line(e.what()), kBadInput);
  } catch (const zeroplan::exec::RendezvousError& e) {
    return fail(where, first_line(e.what()), kBadInput);
  } catch (const zeroplan::exec::CommError& e) {
    return fail(where, first_line(e.what()), kRunFailed);
  } catch (const zeroplan::exec::LaunchError& e) {
    return fail(where, first_line(e.what()), kRunFailed);
  } catch (const zeroplan::sim::SimError& e) {
    return fail(where, first_line(e.what()), kBadInput);
  } catch (const c10::Error& e) {
    return fail(where, "torch: " + zeroplan::zoo::torch_cause(e), kRunFailed);
  } catch (const std::exception& e) {
    return fail(where, first_line(e.what()), kRunFailed);
  }
}
