// The zeroplan command line as one table of subcommands and one map from errors to exit codes, shared by
// the two programs that serve it (DESIGN.md, "The command line"):
//   build/zeroplan        torch-free: simulate, tune, compare, calibrate and plan in-process (they start in
//                         milliseconds); everything else (profile, probe, run, autopilot, --help) it hands
//                         to the torch half with the same arguments.
//   build/zeroplan-torch  every subcommand (profile, probe, run and autopilot need torch).
#pragma once

#include <optional>
#include <string>

#include "cli.h"

namespace zeroplan::cli {

struct Subcommand {
  const char* name;
  const char* help;
  Registrar torch_free;  // its registrar when it needs no torch (served by zeroplan itself), else nullptr
};
const Subcommand* find_subcommand(const std::string& name);
// The registrar of a torch-free subcommand (simulate, tune, compare, calibrate, plan), or nullptr.
inline Registrar torch_free_registrar(const Subcommand& sub) { return sub.torch_free; }

// What a failure prints (one line) and exits with.
struct Failure {
  std::string message;
  int code;
};
// Called inside a catch block: maps the exception in flight, or returns nullopt for the shared map.
using ErrorMap = std::optional<Failure> (*)();
// Prints a failure "zeroplan <cmd>: <line>" and returns its code (the torch half hands a rank's line to its
// launcher instead).
using Reporter = int (*)(const std::string& where, const Failure& failure);
int print_failure(const std::string& where, const Failure& failure);
// The first line of an exception's text (torch and JSON errors run to many).
std::string first_line(const std::string& text);

struct AppSpec {
  Registrar (*registrar)(const Subcommand& sub);  // nullptr: the subcommand is not served here
  std::string footer;                             // after every --help
  ErrorMap extra_errors = nullptr;                // the program's own exception types, before the shared map
  Reporter report = print_failure;
};
// Parses argv, runs the chosen subcommand and maps anything it throws to one line and an exit code: the
// one catch ladder of the command line (the exit-code table of docs/2-subcommands.md).
int run_app(int argc, char** argv, const AppSpec& spec);

}  // namespace zeroplan::cli
