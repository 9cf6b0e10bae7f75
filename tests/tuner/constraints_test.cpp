#include "zeroplan/tuner/constraints.h"

#include <gtest/gtest.h>

#include "zeroplan/profiles/errors.h"

namespace zeroplan::tuner {
namespace {

TEST(Constraints, ParseKnobsAcceptsKnownNamesAndSuggestsForTypos) {
  EXPECT_EQ(parse_knobs("zero_stage, micro_batch"), (std::set<std::string>{"micro_batch", "zero_stage"}));
  EXPECT_TRUE(parse_knobs("").empty());
  try {
    parse_knobs("zero_stag");
    FAIL();
  } catch (const SchemaError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean \"zero_stage\""), std::string::npos) << e.what();
  }
}

TEST(Constraints, ParseFixSplitsAndRejectsUnknownKeys) {
  EXPECT_EQ(parse_fix("zero_stage=3"), (std::pair<std::string, std::string>{"zero_stage", "3"}));
  EXPECT_THROW(parse_fix("zero_stage"), SchemaError);
  EXPECT_THROW(parse_fix("zerostage=3"), SchemaError);
}

// A value out of its knob's range is refused at once with validate's own words for that field (no range
// text parsed here): nothing left to search would otherwise say "0 candidates" without naming the option.
TEST(Constraints, ParseFixRefusesAValueOutOfRangeInValidatesWords) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"zero_stage=7", "tune: --fix zero_stage=7: zero_stage must be 0, 1, 2 or 3 (got 7)"},
      {"offload.activations_ratio=1.5", "tune: --fix offload.activations_ratio=1.5: offload.activations_ratio must be in [0, 1] (got 1.5)"},
      {"microbatches=0", "tune: --fix microbatches=0: microbatches must be >= 1 (got 0)"},
      {"offload_activations=-1", "tune: --fix offload_activations=-1: offload.activations_ratio must be in [0, 1] (got -1.0)"},
  };
  for (const auto& [fix, message] : cases) {
    try {
      parse_fix(fix);
      ADD_FAILURE() << fix << " accepted";
    } catch (const SchemaError& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  }
  EXPECT_EQ(parse_fix("offload_activations=0.5"), (std::pair<std::string, std::string>{"offload.activations_ratio", "0.5"}));
}

TEST(Constraints, ApplyFixedSetsEveryFieldAndNamesBadValues) {
  Plan p;
  apply_fixed(p, "zero_stage", "3");
  apply_fixed(p, "offload_activations", "0.25");
  apply_fixed(p, "checkpointing", "1,3");
  apply_fixed(p, "precision", "fp16");
  apply_fixed(p, "buckets", "large");
  EXPECT_EQ(p.zero_stage, 3);
  EXPECT_DOUBLE_EQ(p.offload.activations_ratio, 0.25);
  EXPECT_EQ(p.checkpointing.mode, Checkpointing::Mode::units);
  EXPECT_EQ(p.checkpointing.units, (std::vector<int>{1, 3}));
  EXPECT_EQ(p.precision.param_dtype, "fp16");
  EXPECT_EQ(p.precision.loss_scale.mode, LossScale::Mode::dynamic);
  EXPECT_EQ(p.buckets.all_reduce_bucket_bytes, 4 * Buckets{}.all_reduce_bucket_bytes);
  try {
    apply_fixed(p, "zero_stage", "x");
    FAIL();
  } catch (const SchemaError& e) {
    EXPECT_STREQ(e.what(), "tune: --fix zero_stage=x: expected an integer");
  }
  EXPECT_THROW(apply_fixed(p, "checkpointing", "3,1"), SchemaError);
}

TEST(Constraints, AKnobVariesWhenListedAndNotFixed) {
  TuneConstraints c;
  EXPECT_TRUE(c.varies("zero_stage"));
  c.fix("zero_stage", "3");
  EXPECT_FALSE(c.varies("zero_stage"));
  c.fix("microbatches", "2");
  EXPECT_FALSE(c.varies("micro_batch"));  // fixing half of a group pins the group
  c.set_knobs({"precision"});
  EXPECT_TRUE(c.varies("precision"));
  EXPECT_FALSE(c.varies("flat_params"));
}

TEST(Constraints, ValidateNamesTheNumbers) {
  TuneConstraints c;
  EXPECT_THROW(validate(c), SchemaError);  // global batch 0
  c.set_global_batch(8);
  validate(c);
  c.set_device_headroom_fraction(1.5);
  try {
    validate(c);
    FAIL();
  } catch (const SchemaError& e) {
    EXPECT_STREQ(e.what(), "tune: device_headroom_fraction must be in [0, 1) (got 1.5)");
  }
}

TEST(Constraints, EveryKnobHasADescriptionAndIsFixable) {
  const auto& keys = fixable_keys();
  for (const auto& k : knob_names()) {
    EXPECT_FALSE(knob_description(k).empty()) << k;
    EXPECT_TRUE(std::binary_search(keys.begin(), keys.end(), k)) << k;
    Plan p;
    (void)p;
  }
}

}  // namespace
}  // namespace zeroplan::tuner
