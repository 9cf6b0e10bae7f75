#include "zeroplan/tuner/granularity.h"

#include <gtest/gtest.h>

#include "fixtures.h"
#include "zeroplan/sim/simulate.h"
#include "zeroplan/profiles/errors.h"

namespace zeroplan::tuner {
namespace {

using testing::a100;

AnalyticGptOptions model() { return fixtures::gpt_options(4, 1024, 8, 512, 1000, "bf16", "gpt-granularity"); }

TuneConstraints constraints() {
  TuneConstraints c;
  c.set_global_batch(8).set_knobs({"zero_stage", "checkpointing", "offload_optimizer"});
  c.fix("precision", "bf16");
  return c;
}

TEST(Granularity, BothAtStageThreeAndTheFasterWins) {
  const GranularityResult r = compare_granularities(model(), a100(1), constraints(), TuneOptions{}.set_threads(2).set_explain(false));
  ASSERT_NE(r.block.best(), nullptr);
  ASSERT_NE(r.sub_block.best(), nullptr);
  EXPECT_EQ(r.block.best()->plan.zero_stage, 3);
  EXPECT_EQ(r.sub_block.best()->plan.zero_stage, 3);
  EXPECT_EQ(r.block.model.expanded_unit_count(), 4 + 2);
  EXPECT_EQ(r.sub_block.model.expanded_unit_count(), 8 + 2);
  EXPECT_EQ(r.block.model.total_params(), r.sub_block.model.total_params());
  const bool sub_faster = r.sub_block.best()->prediction.step_time_s < r.block.best()->prediction.step_time_s;
  EXPECT_EQ(r.better(), sub_faster ? "sub_block" : "block");
  const std::string md = granularity_markdown(r);
  EXPECT_NE(md.find("| block | a transformer block |"), std::string::npos) << md;
  EXPECT_NE(md.find("| sub-block | its attention or its MLP |"), std::string::npos) << md;
}

TEST(Granularity, SubBlocksFitWhereBlocksCannot) {
  // Stage 3 gathers one unit's parameters (and prefetches the next): halves of a block need less.
  const ClusterProfile cl = a100(1);
  const TuneOptions opt = TuneOptions{}.set_threads(2).set_explain(false);
  const GranularityResult ample = compare_granularities(model(), cl, constraints(), opt);
  // The least memory either can use: its least-memory fitting plan (the optimizer offloaded), every unit
  // checkpointed.
  ASSERT_FALSE(ample.block.pareto.empty());
  Plan least = ample.block.pareto.front().plan;
  least.checkpointing.mode = Checkpointing::Mode::all;
  const std::int64_t block_min = sim::simulate(ample.block.model, ample.block.cluster, least).device.total_bytes();
  const std::int64_t sub_min = sim::simulate(ample.sub_block.model, ample.sub_block.cluster, least).device.total_bytes();
  ASSERT_LT(sub_min, block_min);
  TuneConstraints tight = constraints();
  tight.set_device_headroom_bytes(cl.device.mem_bytes - (sub_min + block_min) / 2);
  const GranularityResult r = compare_granularities(model(), cl, tight, opt);
  EXPECT_EQ(r.block.best(), nullptr);
  ASSERT_NE(r.sub_block.best(), nullptr);
  EXPECT_EQ(r.better(), "sub_block");
  EXPECT_NE(granularity_markdown(r).find("| block | a transformer block | nothing fits |"), std::string::npos);
}

TEST(Granularity, FromAnAnalyticProfileOnly) {
  // A profile written by profile --analytic gpt is cut both ways, whichever way it was made.
  AnalyticGptOptions o = model();
  o.sub_blocks = true;
  const TuneOptions opt = TuneOptions{}.set_threads(2).set_explain(false);
  const GranularityResult r = compare_granularities(analytic_gpt(o), a100(1), constraints(), opt);
  EXPECT_EQ(r.block.model.expanded_unit_count(), 4 + 2);
  EXPECT_EQ(r.sub_block.model.expanded_unit_count(), 8 + 2);
  try {
    (void)compare_granularities(testing::small_gpt(), a100(1), constraints(), opt);
    FAIL();
  } catch (const SchemaError& e) {
    EXPECT_STREQ(e.what(), "granularity: model \"gpt-small\" (analytic:gpt) is not an analytic GPT profile as `zeroplan "
                           "profile --analytic gpt` writes it; only those can be cut both ways");
  }
}

TEST(Granularity, AnotherFixedStageIsRefused) {
  TuneConstraints c = constraints();
  c.fix("zero_stage", "2");
  try {
    (void)compare_granularities(model(), a100(1), c);
    FAIL();
  } catch (const SchemaError& e) {
    EXPECT_STREQ(e.what(), "granularity: zero_stage is fixed to 2; the comparison is at stage 3");
  }
}

}  // namespace
}  // namespace zeroplan::tuner
