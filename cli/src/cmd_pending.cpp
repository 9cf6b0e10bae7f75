// Subcommands that later issues fill (tune, autopilot). Until then each exits 2
// with "zeroplan <cmd>: not implemented yet", as the foundation issue specifies.
#include "cli.h"

namespace zeroplan::cli {
namespace {

Action pending() {
  return []() -> int { throw ExitError(kNotPossibleHere, "not implemented yet"); };
}

}  // namespace

Action add_autopilot(CLI::App& app, const Globals&) {
  app.allow_extras();
  return pending();
}

}  // namespace zeroplan::cli
