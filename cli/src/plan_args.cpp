#include "plan_args.h"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "zeroplan/profiles/json_io.h"

namespace zeroplan::cli {

Plan plan_from_args(const PlanArgs& args) {
  const int ws = args.world_size.value_or(1);
  Plan base = args.file.empty() ? Plan::default_ddp(ws, args.global_batch.value_or(ws))
                                : read_document<Plan>(args.file);
  nlohmann::json j = base;
  auto sets = parse_key_values(args.sets, "--set");
  if (args.world_size) sets["world_size"] = std::to_string(*args.world_size);
  if (args.global_batch) {
    // Keep the batch identity: the micro batch follows the global batch unless it is set explicitly.
    sets["global_batch"] = std::to_string(*args.global_batch);
  }
  for (const auto& [key, text] : sets) {
    nlohmann::json* node = &j;
    size_t start = 0;
    while (true) {
      size_t dot = key.find('.', start);
      std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (!node->is_object() || !node->contains(part))
        throw ExitError(kBadInput, fmt::format("--set {}: plan has no field \"{}\"", key, key.substr(0, dot)));
      node = &(*node)[part];
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
    *node = value.is_discarded() ? nlohmann::json(text) : value;
  }
  if (!args.file.empty() && sets.empty()) return base;
  // Without an explicit micro batch, derive it so that the batch identity holds.
  if (!sets.count("micro_batch") && (sets.count("global_batch") || sets.count("world_size") || sets.count("microbatches"))) {
    int gb = j["global_batch"].get<int>(), ws = j["world_size"].get<int>(), mb = j["microbatches"].get<int>();
    if (ws > 0 && mb > 0 && gb % (ws * mb) == 0) j["micro_batch"] = gb / (ws * mb);
  }
  return parse_document<Plan>(j.dump(), "plan (--plan/--set)");
}

}  // namespace zeroplan::cli
