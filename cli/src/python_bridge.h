// A Python model (`--python FILE.py:FACTORY`) reaches the CLI through the zeroplan Python package: the
// subcommand runs `<python> -m zeroplan profile ...` (the venv's Python, ZEROPLAN_PYTHON_EXE) with the
// package and this build's extension on its path, which profiles by capture and replay in the C++ core
// (zeroplan._C) and writes the ModelProfile; its one-line error and exit code come back as an ExitError.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/profiler.h"

namespace zeroplan::cli {

struct PythonModelArgs {
  std::string spec;            // FILE.py:FACTORY
  std::string policy = "auto"; // --units: auto | comma-separated classes or module names
  bool verbose = false;        // the child's Python traceback on failure
  std::string trace;           // --trace: the profiling run as a Chrome trace
};

// Profiles the Python model with `options` (batch, batches, repeats, warmup, threads, device, dtype,
// concurrent_ranks). Throws ExitError with the child's line and exit code.
ModelProfile profile_python(const PythonModelArgs& model, const ProfileOptions& options);

// The venv's Python (ExitError when missing) and the variables a rank of `run --python` needs beside the
// launcher's: the package and this build's extension on its path.
std::string python_exe();
std::vector<std::pair<std::string, std::string>> python_env();

}  // namespace zeroplan::cli
