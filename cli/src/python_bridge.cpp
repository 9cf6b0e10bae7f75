#include "python_bridge.h"

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "cli.h"
#include "zeroplan/config.h"
#include "zeroplan/profiles/json_io.h"

namespace zeroplan::cli {
namespace {

namespace fs = std::filesystem;

// This binary's folder: the build folder whose python/zeroplan holds the extension.
fs::path build_dir() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : self.parent_path();
}

// Runs argv with the package on PYTHONPATH; returns the exit status (128 + N for a signal).
int spawn(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const auto env = python_env();  // before the fork: the child only sets them
  const pid_t pid = fork();
  if (pid < 0) throw ExitError(kRunFailed, fmt::format("cannot start {}: {}", argv[0], std::strerror(errno)));
  if (pid == 0) {
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    execv(args[0], args.data());
    std::fprintf(stderr, "zeroplan: cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace

std::string python_exe() {
  if (!fs::exists(ZEROPLAN_PYTHON_EXE))
    throw ExitError(kNotPossibleHere, fmt::format("--python needs the Python of this build ({}), which is missing; "
                                                  "run scripts/setup.sh", ZEROPLAN_PYTHON_EXE));
  return ZEROPLAN_PYTHON_EXE;
}

std::vector<std::pair<std::string, std::string>> python_env() {
  const std::string pythonpath = std::string(ZEROPLAN_SOURCE_DIR) + "/python";
  const char* old = std::getenv("PYTHONPATH");
  return {{"PYTHONPATH", old && *old ? pythonpath + ":" + old : pythonpath}, {"ZEROPLAN_BUILD_DIR", build_dir().string()}};
}

ModelProfile profile_python(const PythonModelArgs& model, const ProfileOptions& o) {
  python_exe();
  const fs::path tmp = fs::temp_directory_path() / fmt::format("zeroplan-python-{}", getpid());
  fs::create_directories(tmp);
  const fs::path out = tmp / "profile.json", err = tmp / "error.txt";
  std::vector<std::string> argv = {ZEROPLAN_PYTHON_EXE, "-m", "zeroplan", "profile", "--python", model.spec,
                                   "-o", out.string(), "--error-file", err.string(), "--units", model.policy,
                                   "--batch", std::to_string(o.batch), "--warmup", std::to_string(o.warmup),
                                   "--repeats", std::to_string(o.repeats), "--threads", std::to_string(o.threads),
                                   "--device", o.device, "--dtype", o.dtype,
                                   "--concurrent-ranks", std::to_string(o.concurrent_ranks)};
  if (!o.batches.empty()) {
    argv.push_back("--batches");
    argv.push_back(fmt::format("{}", fmt::join(o.batches, ",")));
  }
  if (o.progress) argv.push_back("--progress");
  if (model.verbose) argv.push_back("--verbose");
  if (!model.trace.empty()) {
    argv.push_back("--trace");
    argv.push_back(model.trace);
  }
  const int rc = spawn(argv);
  std::string message;
  if (std::ifstream in(err); in) {
    std::getline(in, message);
  }
  if (rc != 0) {
    fs::remove_all(tmp);
    if (message.empty()) message = fmt::format("the Python profiler ({} -m zeroplan) exited with {}", argv[0], rc);
    throw ExitError(rc >= 1 && rc <= 3 ? rc : kRunFailed, message);
  }
  ModelProfile profile = read_document<ModelProfile>(out);
  fs::remove_all(tmp);
  return profile;
}

}  // namespace zeroplan::cli
