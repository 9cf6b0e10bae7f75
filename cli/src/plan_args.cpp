#include "plan_args.h"

#include <fmt/core.h>

#include <set>
#include <utility>

#include "cli.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/profiles/knobs.h"

namespace zeroplan::cli {
namespace {

// "k=v,k2=v2" or repeated "k=v" -> pairs in order; a piece without '=' continues the previous value
// ("checkpointing=1,3"). Throws ExitError(kBadInput) naming the bad item.
std::vector<std::pair<std::string, std::string>> split_sets(const std::vector<std::string>& items) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& item : items) {
    bool first = true;
    std::size_t start = 0;
    while (start <= item.size()) {
      const std::size_t comma = item.find(',', start);
      const std::string piece = item.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      const auto eq = piece.find('=');
      if (eq == std::string::npos && !first) {
        out.back().second += "," + piece;
      } else if (eq == std::string::npos || eq == 0 || eq + 1 == piece.size()) {
        throw ExitError(kBadInput, fmt::format("--set: expected key=value, got \"{}\"", piece));
      } else {
        out.emplace_back(piece.substr(0, eq), piece.substr(eq + 1));
      }
      first = false;
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  return out;
}

}  // namespace

Plan plan_from_args(const PlanArgs& args) {
  const int ws = args.world_size.value_or(1);
  const Plan base = args.file.empty() ? Plan::default_ddp(ws, args.global_batch.value_or(ws))
                                      : read_document<Plan>(args.file);
  auto sets = split_sets(args.sets);
  if (args.world_size) sets.emplace_back("world_size", std::to_string(*args.world_size));
  if (args.global_batch) sets.emplace_back("global_batch", std::to_string(*args.global_batch));
  if (!args.file.empty() && sets.empty()) return base;
  // Each --set through the knob registry; knobs not given follow their dependent defaults (the micro
  // batch follows the global batch, reshard_after_forward follows zero_stage 3).
  Plan plan = base;
  std::set<std::string> given;
  for (const auto& [key, text] : sets) {
    const Knob& k = knob(key, "--set " + key + "=" + text);
    set_knob_text(plan, k, text, "--set");
    given.insert(k.name);
  }
  apply_dependent_defaults(base, plan, given);
  try {
    validate(plan);
  } catch (const SchemaError& e) {
    throw SchemaError(fmt::format("plan (--plan/--set): {}", e.what()));
  }
  return plan;
}

}  // namespace zeroplan::cli
