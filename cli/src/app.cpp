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

// The exit codes and what each stands for: exit_code, kind_of_exit_code and the --help footer read this
// one table (docs/2-subcommands.md's table is checked against the footer by cli.errors).
struct ExitRow {
  int code;
  const char* label;  // as --help and the docs' table name it
  ErrorKind kind;
};
constexpr std::array<ExitRow, 4> kExitRows{{
    {kBadInput, "bad input", ErrorKind::bad_input},
    {kNotPossibleHere, "not possible here", ErrorKind::not_possible_here},
    {kRunFailed, "run failed", ErrorKind::run_failed},
    {kRunFailed, "run failed", ErrorKind::internal},  // an error of zeroplan itself is reported as a failure
}};

// The one catch ladder, for the exception in flight: any zeroplan Error by its kind (an ExitError by its
// code); torch's and the standard library's errors that reach here are run failures (3).
Failure shared_failure() {
  try {
    throw;
  } catch (const Error& e) {
    return {first_line(e.what()), exit_code(e)};
  } catch (const std::exception& e) {
    return {first_line(e.what()), kRunFailed};
  } catch (...) {
    return {"unknown error", kRunFailed};
  }
}

}  // namespace

ErrorKind kind_of_exit_code(int code) {
  if (code > 128) return ErrorKind::interrupted;
  for (const ExitRow& r : kExitRows)
    if (r.code == code) return r.kind;
  return ErrorKind::internal;
}

int exit_code(const Error& e) {
  if (const auto* x = dynamic_cast<const ExitError*>(&e)) return x->code();
  if (e.kind() == ErrorKind::interrupted) return 128 + 2;  // SIGINT's, when no signal is known
  for (const ExitRow& r : kExitRows)
    if (r.kind == e.kind()) return r.code;
  return kRunFailed;
}

std::string exit_code_list() {
  std::string out = "0 ok";
  for (const ExitRow& r : kExitRows)
    if (r.kind != ErrorKind::internal) out += fmt::format(", {} {}", r.code, r.label);
  return out + ", 128+N stopped by signal N";
}

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
      "Exit codes: " + exit_code_list() + ".";
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
