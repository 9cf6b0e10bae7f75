// Shared pieces of the zeroplan command line: exit codes, the error that carries one, the --help
// footer listing what is registered, and small parsers.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "zeroplan/profiles/errors.h"

namespace zeroplan::cli {

// Fixed and documented exit codes (README, `zeroplan --help`).
enum ExitCode : int {
  kOk = 0,
  kBadInput = 1,        // bad file, bad plan, unknown model or cluster, plan that cannot fit
  kNotPossibleHere = 2, // needs hardware or a feature this build or machine does not have
  kRunFailed = 3,       // a run started and failed: dead rank, timeout, out of device memory
  // 128 + N: `run --nproc` stopped by signal N (SIGTERM 143, SIGINT 130, SIGHUP 129); ranks stopped.
};

// The error kind each exit code stands for (1 bad_input, 2 not_possible_here, 3 run_failed, 128 + N
// interrupted).
ErrorKind kind_of_exit_code(int code);
// The one place kinds become exit codes (app.cpp): an ExitError's own code, else its kind's.
int exit_code(const Error& e);
// "0 ok, 1 bad input, 2 not possible here, 3 run failed, 128+N stopped by signal N": the --help footer's
// list, from the same table exit_code reads (cli.errors checks docs/2-subcommands.md against it).
std::string exit_code_list();

// An Error with its exit code; what() is the one line printed after "zeroplan <cmd>: ".
class ExitError : public Error {
 public:
  ExitError(int code, const std::string& message) : Error(kind_of_exit_code(code), message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

struct Globals {
  bool json = false;  // print the produced document on stdout
  bool quiet = false; // no tables or progress on stderr
  std::vector<std::string> argv;  // the whole command line (the launcher re-runs it per rank)
};

// A subcommand registers its options on `app` and returns the action run when it is chosen.
using Action = std::function<int()>;
using Registrar = Action (*)(CLI::App& app, const Globals& globals);

// Bytes as "12.34 GiB", for the console tables.
std::string gib(std::int64_t bytes);

// "k=v,k2=v2" or repeated "k=v" -> map; throws ExitError(kBadInput) naming the bad item.
std::map<std::string, std::string> parse_key_values(const std::vector<std::string>& items,
                                                    const std::string& what);

// Checks that --model names a ModelProfile file; when it names no file (e.g. a built-in model's name),
// the message shows the command that makes a profile of it.
// Numeric option checks whose message names the value in one line ("must be > 0 (got -1)"): finite,
// and in [lo, hi] (open at lo when `open_lo`).
CLI::Validator number_in(double lo, double hi, bool open_lo = false);
inline CLI::Validator positive() { return number_in(0, 1e300, true); }
inline CLI::Validator non_negative() { return number_in(0, 1e300); }
// An output path: refused when empty (-o '').
// An output that can be written, checked when the option is parsed, before any work (a path into /proc
// or a read-only folder is refused at once, not after a long run): output_path() a file, whose folder
// exists and takes a new file; output_folder() a folder, made as needed, whose nearest existing ancestor
// takes a new file.
CLI::Validator output_path();
CLI::Validator output_folder();
// A thread count: 0 (all cores) up to 16 x this machine's cores (more is a typo, and torch crashes on it).
CLI::Validator threads_option();
CLI::Validator model_profile_file();

Action add_profile(CLI::App& app, const Globals& globals);
Action add_probe(CLI::App& app, const Globals& globals);
Action add_simulate(CLI::App& app, const Globals& globals);
Action add_tune(CLI::App& app, const Globals& globals);
Action add_run(CLI::App& app, const Globals& globals);
Action add_compare(CLI::App& app, const Globals& globals);
Action add_autopilot(CLI::App& app, const Globals& globals);
Action add_plan(CLI::App& app, const Globals& globals);
Action add_calibrate(CLI::App& app, const Globals& globals);

}  // namespace zeroplan::cli
