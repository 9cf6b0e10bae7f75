// "Largest model that fits": for a family of GPT shapes, the largest that trains under the constraints,
// and with which plan (zeroplan tune --max-model gpt).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/tuner/constraints.h"
#include "zeroplan/tuner/tune.h"

namespace zeroplan::tuner {

struct GptShape {
  std::string name;  // "gpt3-175b"
  std::int64_t layers = 0;
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
};

// GPT-3's sizes (Brown et al. 2020, table 2.1; heads fixed so that hidden / heads = 128 where the table
// disagrees with itself) and larger published ones (GPT-NeoX-20B, OPT-66B, MT-NLG-530B, Megatron-1T),
// smallest first.
const std::vector<GptShape>& gpt_family();

struct MaxModelOptions {
  std::int64_t seq = 2048;
  std::int64_t vocab = 50257;
  std::string dtype = "fp16";       // the analytic profiles' dtype
  std::vector<GptShape> family;     // empty: gpt_family()
  TuneOptions tune;                 // for each tune (explain is turned off except for the answer)
};

struct MaxModelTry {
  GptShape shape;
  std::int64_t params = 0;
  bool fits = false;
  std::optional<RankedPlan> best;  // when it fits
  std::string why_not;             // when it does not: the closest miss, or the error
};

struct MaxModelResult {
  std::vector<MaxModelTry> tried;          // in the order tried (a binary search over the family)
  int largest = -1;                        // index into the family of the largest that fits; -1: none
  std::optional<TuneResult> largest_tune;  // the full tune of that model (for write_reports)
};

// Binary search over the family, assuming that when a model fits every smaller one does. Throws
// SchemaError when the constraints are unusable.
MaxModelResult max_model(const ClusterProfile& cluster, const TuneConstraints& constraints, const MaxModelOptions& options = {});

// A short Markdown summary: each model tried, whether it fits, and the answer.
std::string max_model_markdown(const MaxModelResult& result, const MaxModelOptions& options = {});

}  // namespace zeroplan::tuner
