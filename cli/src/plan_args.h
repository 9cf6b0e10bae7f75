// Plans from the command line: a Plan file, or the default DDP plan, with key=value overrides.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "zeroplan/profiles/plan.h"

namespace zeroplan::cli {

struct PlanArgs {
  std::string file;                   // --plan FILE ("" = the default DDP plan)
  std::vector<std::string> sets;      // --set key=value, dotted keys (offload.params=true)
  std::optional<int> world_size;      // --world-size, overrides the file's
  std::optional<int> global_batch;    // --global-batch, overrides the file's
};

// Reads or builds the plan, applies the overrides (values parsed as JSON when they parse, else as
// strings), then validates. Throws SchemaError / ExitError(kBadInput) naming the bad key or value.
Plan plan_from_args(const PlanArgs& args);

}  // namespace zeroplan::cli
