// zeroplan: one command line, one subcommand per arrow of the data flow (DESIGN.md). This program is
// torch-free: it serves simulate, tune, compare, calibrate and plan itself (in milliseconds: loading
// torch's libraries alone takes half a second) and hands every other command line (profile, probe, run,
// autopilot, --help, --version) unchanged to zeroplan-torch beside it (app.h). Every error reaches the
// user as one line and a fixed exit code, never a backtrace.
#include <fmt/core.h>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "app.h"
#include "cli.h"

namespace zeroplan::cli {
namespace {

namespace fs = std::filesystem;

// The subcommand a command line names (global flags may come first), or "" for none.
std::string subcommand_of(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-q" || a == "--quiet" || a == "--json") continue;
    return a;
  }
  return "";
}

bool asks_for_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help" || a == "--help-all" || a == "--version") return true;
  }
  return false;
}

// Replaces this process by zeroplan-torch (this program's folder) with the same arguments.
[[noreturn]] void hand_to_torch_half(char** argv, const std::string& subcommand) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const fs::path torch_half = (ec ? fs::path(argv[0]).parent_path() : self.parent_path()) / "zeroplan-torch";
  const std::string where = subcommand.empty() || find_subcommand(subcommand) == nullptr
                                ? std::string("zeroplan")
                                : "zeroplan " + subcommand;
  if (!fs::exists(torch_half, ec)) {
    print_failure(where, {fmt::format("needs {} (the torch half of zeroplan), which this build does not have: "
                                      "build it with -DZEROPLAN_WITH_TORCH=ON",
                                      torch_half.string()),
                          kNotPossibleHere});
    std::exit(kNotPossibleHere);
  }
  execv(torch_half.c_str(), argv);
  print_failure(where, {fmt::format("cannot run {}: {}", torch_half.string(), std::strerror(errno)), kRunFailed});
  std::exit(kRunFailed);
}

}  // namespace
}  // namespace zeroplan::cli

int main(int argc, char** argv) {
  using namespace zeroplan::cli;
  const std::string sub = subcommand_of(argc, argv);
  const Subcommand* known = find_subcommand(sub);
  // Served here: a torch-free subcommand that does not ask for help (--help lists the models, which only
  // the torch half knows). An unknown word goes to the torch half too, which refuses it as ever.
  if (known != nullptr && known->torch_free != nullptr && !asks_for_help(argc, argv)) return run_app(argc, argv, AppSpec{torch_free_registrar, ""});
  hand_to_torch_half(argv, sub);
}
