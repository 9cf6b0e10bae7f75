#include "zeroplan/sim/price.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "zeroplan/profiles/errors.h"

namespace zeroplan::sim {
namespace {

RunRecord record(const Plan& plan, std::vector<double> losses, double step_s) {
  RunRecord r;
  r.model = "gpt";
  r.plan = plan;
  r.losses = std::move(losses);
  r.step_times_s.assign(r.losses.size(), step_s);
  r.compute_step_statistics();
  return r;
}

Plan ddp() {
  Plan p = Plan::default_ddp(4, 8);
  p.seed = 3;
  return p;
}

TEST(AveragingPrice, LossOverTheLastQuarterAndSpeedup) {
  Plan local = ddp();
  local.localsgd_frequency = 4;
  // 8 steps: the last quarter is steps 6 and 7.
  const RunRecord run = record(local, {9, 8, 7, 6, 5, 4, 3.5, 2.5}, 0.2);
  const RunRecord base = record(ddp(), {9, 8, 7, 6, 5, 4, 3, 2, 1, 0.5}, 0.3);
  const AveragingPrice p = averaging_price(run, base, "ddp.json");
  EXPECT_EQ(p.baseline, "ddp.json");
  EXPECT_EQ(p.strategy, "LocalSGD every 4 steps");
  EXPECT_EQ(p.steps, 8);
  EXPECT_DOUBLE_EQ(p.loss, 3.0);
  EXPECT_DOUBLE_EQ(p.baseline_loss, 2.5);
  EXPECT_DOUBLE_EQ(p.loss_change, 0.2);
  EXPECT_DOUBLE_EQ(p.speedup, 1.5);
}

TEST(AveragingPrice, StrategiesAreNamed) {
  Plan p = ddp();
  EXPECT_EQ(averaging_strategy(p), "synchronous");
  p.adascale = true;
  EXPECT_EQ(averaging_strategy(p), "AdaScale");
  p.adascale = false;
  p.localsgd_frequency = 4;
  p.slowmo_frequency = 4;
  p.slowmo_momentum = 0.5;
  p.localsgd_warmup_steps = 2;
  EXPECT_EQ(averaging_strategy(p), "SlowMo every 4 steps (momentum 0.5, slow lr 1) after 2 synchronous");
}

TEST(AveragingPrice, RefusesWhatIsNotComparable) {
  Plan local = ddp();
  local.localsgd_frequency = 4;
  const RunRecord run = record(local, {3, 2}, 0.2);
  const RunRecord base = record(ddp(), {3, 2}, 0.3);
  EXPECT_THROW(averaging_price(base, base, "b"), SchemaError);  // the measured run is synchronous
  EXPECT_THROW(averaging_price(run, run, "b"), SchemaError);    // the baseline is not
  Plan other_seed = ddp();
  other_seed.seed = 4;
  try {
    averaging_price(run, record(other_seed, {3, 2}, 0.3), "b");
    FAIL() << "another seed was accepted";
  } catch (const SchemaError& e) {
    EXPECT_STREQ(e.what(), "compare --baseline: seed differs: 3 and baseline 4");
  }
  const RunRecord nan_run = record(local, {3, std::numeric_limits<double>::quiet_NaN()}, 0.2);
  EXPECT_THROW(averaging_price(nan_run, base, "b"), SchemaError);
}

}  // namespace
}  // namespace zeroplan::sim
