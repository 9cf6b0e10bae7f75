// zeroplan-torch: every subcommand, the torch half of the command line (app.h). `zeroplan` hands it
// profile, probe, run, autopilot and --help; it also runs on its own. Its own exception types (the
// executor's, the launcher's, torch's) join the shared map of app.cpp here.
#include <fmt/core.h>

#include <c10/util/Exception.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "app.h"
#include "cli.h"
#include "zeroplan/exec/communicator.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/exec/launcher.h"
#include "zeroplan/exec/probe.h"
#include "zeroplan/exec/rendezvous.h"
#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/zoo.h"

namespace zeroplan::cli {
namespace {

// The built-in models (with presets) and the shipped cluster profiles, after every --help.
std::string registry_footer() {
  std::string out = "Models (--model NAME [--preset P] [--opt k=v]):\n";
  for (const auto& m : zoo::registered_models()) {
    out += fmt::format("  {:<10} {}\n", m.name, m.description);
    if (!m.presets.empty()) {
      std::string presets;
      for (const auto& [name, _] : m.presets) presets += (presets.empty() ? "" : ", ") + name;
      out += fmt::format("  {:<10}   presets: {}\n", "", presets);
    }
  }
  out += "Cluster profiles (--cluster NAME[:NODES] or FILE):\n";
  try {
    for (const auto& c : list_shipped_clusters()) out += fmt::format("  {:<16} {}\n", c.name, c.description);
  } catch (const std::exception& e) {
    out += fmt::format("  (none found: {})\n", e.what());
  }
  return out;
}

// Every subcommand: the torch-free ones (app.cpp) and those that need torch.
Registrar registrar(const Subcommand& sub) {
  if (const Registrar r = torch_free_registrar(sub)) return r;
  const std::string name = sub.name;
  if (name == "profile") return add_profile;
  if (name == "probe") return add_probe;
  if (name == "run") return add_run;
  if (name == "autopilot") return add_autopilot;
  return nullptr;
}

// torch's own errors (not zeroplan Errors, which the shared ladder maps by kind): a run failure, its
// cause in one line, never torch's backtrace.
std::optional<Failure> torch_errors() {
  try {
    throw;
  } catch (const c10::Error& e) {
    return Failure{"torch: " + zoo::torch_cause(e), kRunFailed};
  } catch (...) {
    return std::nullopt;
  }
}

// A rank started by `zeroplan run --nproc` hands its line to the launcher (the TorchElastic error file
// the launcher reads) instead of printing it, so the user sees the failure once, from the launcher.
int report(const std::string& where, const Failure& failure) {
  const char* launcher = std::getenv("ZEROPLAN_LAUNCHER");
  const char* error_file = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (launcher != nullptr && std::string(launcher) == "zeroplan" && error_file != nullptr && *error_file) {
    // The first error a rank wrote (cmd_run's session->fail) is its cause; otherwise this one.
    if (!std::filesystem::exists(error_file)) exec::write_error_file(error_file, failure.message);
    if (std::filesystem::exists(error_file)) return failure.code;
  }
  return print_failure(where, failure);
}

}  // namespace
}  // namespace zeroplan::cli

int main(int argc, char** argv) {
  using namespace zeroplan::cli;
  return run_app(argc, argv, AppSpec{registrar, registry_footer(), torch_errors, report});
}
