// Unit granularity at ZeRO stage 3: FSDP wraps either whole transformer blocks or their attention and
// MLP separately (auto-wrap policies), and the wrapped unit is what stage 3 gathers at once. For an
// analytic GPT, the best stage-3 plan at each granularity (AnalyticGptOptions::sub_blocks off and on).
#pragma once

#include <string>

#include "zeroplan/profiles/analytic.h"
#include "zeroplan/profiles/cluster.h"
#include "zeroplan/tuner/constraints.h"
#include "zeroplan/tuner/tune.h"

namespace zeroplan::tuner {

struct GranularityResult {
  TuneResult block;      // one unit per transformer block
  TuneResult sub_block;  // attention and MLP as separate units
  // "sub_block" when only it fits or its best plan is faster, "block" when only that fits or it is at
  // least as fast, "" when neither fits.
  std::string better() const;
};

// Tunes `model` twice with zero_stage fixed to 3 (any other fix in `constraints` is kept). Throws
// SchemaError when the constraints are unusable or already fix zero_stage to something else.
GranularityResult compare_granularities(AnalyticGptOptions model, const ClusterProfile& cluster,
                                        TuneConstraints constraints, const TuneOptions& options = {});
// The same for a profile made by analytic_gpt() (profile --analytic gpt, either granularity). Throws
// SchemaError when it is not one.
GranularityResult compare_granularities(const ModelProfile& model, const ClusterProfile& cluster,
                                        TuneConstraints constraints, const TuneOptions& options = {});

// A short Markdown table: per granularity, units gathered, the best plan's samples/s, device peak and
// exposed communication, and which wins.
std::string granularity_markdown(const GranularityResult& result);

}  // namespace zeroplan::tuner
