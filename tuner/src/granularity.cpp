// Block against sub-block units at stage 3 (granularity.h).
#include "zeroplan/tuner/granularity.h"

#include <fmt/format.h>

#include "export_common.h"
#include "text.h"
#include "zeroplan/profiles/errors.h"

namespace zeroplan::tuner {

std::string GranularityResult::better() const {
  const RankedPlan* b = block.best();
  const RankedPlan* s = sub_block.best();
  if (b == nullptr && s == nullptr) return "";
  if (b == nullptr) return "sub_block";
  if (s == nullptr) return "block";
  return s->prediction.step_time_s < b->prediction.step_time_s ? "sub_block" : "block";
}

GranularityResult compare_granularities(AnalyticGptOptions model, const ClusterProfile& cluster,
                                        TuneConstraints constraints, const TuneOptions& options) {
  if (auto it = constraints.fixed.find("zero_stage"); it != constraints.fixed.end() && it->second != "3")
    throw SchemaError(fmt::format("granularity: zero_stage is fixed to {}; the comparison is at stage 3", it->second));
  constraints.fix("zero_stage", "3");
  GranularityResult r;
  model.sub_blocks = false;
  r.block = tune(analytic_gpt(model), cluster, constraints, options);
  model.sub_blocks = true;
  r.sub_block = tune(analytic_gpt(model), cluster, constraints, options);
  return r;
}

GranularityResult compare_granularities(const ModelProfile& model, const ClusterProfile& cluster,
                                        TuneConstraints constraints, const TuneOptions& options) {
  const std::optional<AnalyticGptOptions> o = analytic_gpt_options_of(model);
  if (!o)
    throw SchemaError(fmt::format("granularity: model \"{}\" ({}) is not an analytic GPT profile as `zeroplan profile "
                                  "--analytic gpt` writes it; only those can be cut both ways",
                                  model.name, model.source));
  return compare_granularities(*o, cluster, std::move(constraints), options);
}

std::string granularity_markdown(const GranularityResult& r) {
  std::string md = "| units | gathered at once | samples/s | device peak | exposed communication | plan |\n|---|---|---|---|---|---|\n";
  const auto row = [&](const char* name, const char* gathered, const TuneResult& t) {
    const RankedPlan* b = t.best();
    if (b == nullptr) {
      md += fmt::format("| {} | {} | nothing fits | | | |\n", name, gathered);
      return;
    }
    md += fmt::format("| {} | {} | {:.1f} | {} | {:.3f} s | {} |\n", name, gathered, b->prediction.samples_per_s,
                      text::bytes(b->prediction.device.total_bytes()), b->prediction.exposed_comm_s,
                      exports::plan_summary(b->plan));
  };
  row("block", "a transformer block", r.block);
  row("sub-block", "its attention or its MLP", r.sub_block);
  const std::string w = r.better();
  md += w.empty() ? "\nNeither granularity fits at stage 3.\n"
                  : fmt::format("\nAt stage 3 the {} units win.\n", w == "sub_block" ? "sub-block" : "block");
  return md;
}

}  // namespace zeroplan::tuner
