#include "app.h"

#include <fmt/core.h>

#include <array>
#include <cstdio>
#include <exception>

#include "zeroplan/config.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/sim/errors.h"

namespace zeroplan::cli {
namespace {

// Every subcommand, in `zeroplan --help` order.
constexpr std::array<Subcommand, 9> kSubcommands{{
    {"profile", "Measure a model unit by unit (or derive it analytically) -> ModelProfile", nullptr},
    {"probe", "Measure this machine -> ClusterProfile", nullptr},
    {"simulate", "Simulate one training step of a Plan -> Prediction", add_simulate},
    {"tune", "Search every strategy knob for the fastest plan that fits -> ranked Plans", add_tune},
    {"run", "Train with a Plan on real ranks (c10d: Gloo on CPU, NCCL on CUDA) -> RunRecord", nullptr},
    {"compare", "Predicted vs measured -> Comparison", add_compare},
    {"calibrate", "Fit the cluster file's time-model terms to measured runs -> calibrated ClusterProfile", add_calibrate},
    {"autopilot", "Profile, probe, tune, run and compare on this machine in one command", nullptr},
    {"plan", "Describe the Plan: --fields lists every knob (range, default, simulate / tune / run)", add_plan},
}};

// The shared map, for the exception in flight: ExitError carries its own code; an input the schema or
// the simulator refuses is 1; anything else is a run that failed (3).
Failure shared_failure() {
  try {
    throw;
  } catch (const ExitError& e) {
    return {e.what(), e.code()};
  } catch (const SchemaError& e) {
    return {first_line(e.what()), kBadInput};
  } catch (const sim::SimError& e) {
    return {first_line(e.what()), kBadInput};
  } catch (const std::exception& e) {
    return {first_line(e.what()), kRunFailed};
  } catch (...) {
    return {"unknown error", kRunFailed};
  }
}

}  // namespace

std::string first_line(const std::string& text) {
  auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

const Subcommand* find_subcommand(const std::string& name) {
  for (const auto& s : kSubcommands)
    if (name == s.name) return &s;
  return nullptr;
}

int print_failure(const std::string& where, const Failure& failure) {
  fmt::print(stderr, "{}: {}\n", where, failure.message);
  return failure.code;
}

int run_app(int argc, char** argv, const AppSpec& spec) {
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
  const std::string footer = spec.footer +
      "\nNew here? Start with `zeroplan autopilot`: it profiles a built-in model, probes this machine, tunes, "
      "runs the best plans on 2 local ranks and compares predicted with measured.\n"
      "Exit codes: 0 ok, 1 bad input, 2 not possible here, 3 run failed.";
  app.footer(footer);

  Action chosen;
  for (const auto& s : kSubcommands) {
    const Registrar add = spec.registrar(s);
    if (add == nullptr) continue;
    CLI::App* sub = app.add_subcommand(s.name, s.help);
    sub->footer(footer);
    Action action = add(*sub, globals);
    sub->callback([&chosen, action] { chosen = action; });
  }

  std::string where = "zeroplan";
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
  } catch (...) {
    std::optional<Failure> failure = spec.extra_errors ? spec.extra_errors() : std::nullopt;
    return spec.report(where, failure ? *failure : shared_failure());
  }
}

}  // namespace zeroplan::cli
