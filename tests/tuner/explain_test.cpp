#include "zeroplan/tuner/explain.h"

#include <gtest/gtest.h>

#include "fixtures.h"

namespace zeroplan::tuner {
namespace {

using testing::a100;
using testing::small_gpt;

TEST(Explain, DifferingKnobsInCanonicalOrder) {
  Plan a = Plan::default_ddp(8, 64);
  Plan b = a;
  b.zero_stage = 3;
  b.reshard_after_forward = true;
  b.offload.activations_ratio = 0.25;
  b.micro_batch = 4;
  b.microbatches = 2;
  EXPECT_EQ(differing_knobs(a, b),
            (std::vector<std::string>{"zero_stage", "reshard_after_forward", "offload_activations", "micro_batch"}));
  EXPECT_EQ(knob_value(b, "micro_batch"), "4 x 2");
  EXPECT_EQ(knob_value(b, "offload_activations"), "0.25");
}

// The walk telescopes: each step starts where the previous ended, the first at the other plan, the last
// at the winner.
TEST(Explain, WalkFromTheDefaultTelescopesToTheWinner) {
  const ModelProfile m = small_gpt();
  const auto ev = make_simulator(m, a100(1));
  Plan winner = Plan::default_ddp(8, 64);
  winner.zero_stage = 3;
  winner.offload = {true, true, true, 0.5};
  winner.micro_batch = 2;
  winner.microbatches = 4;
  const Prediction wp = ev->simulate(winner);
  const Plan def = Plan::default_ddp(8, 64);
  const MemoryLimits lim{wp.device.total_bytes(), 1LL << 50};
  const PlanComparison c = compare_plans("default", winner, wp, def, nullptr, *ev, lim);
  ASSERT_TRUE(c.other_simulated);
  EXPECT_FALSE(c.other_fits);
  ASSERT_GE(c.steps.size(), 5u);
  EXPECT_EQ(c.steps.front().knobs, std::vector<std::string>{"zero_stage"});
  EXPECT_DOUBLE_EQ(c.steps.front().step_time_before_s, c.other_prediction.step_time_s);
  for (std::size_t i = 1; i < c.steps.size(); ++i) {
    EXPECT_DOUBLE_EQ(c.steps[i].step_time_before_s, c.steps[i - 1].step_time_after_s);
    EXPECT_EQ(c.steps[i].device_before_bytes, c.steps[i - 1].device_after_bytes);
  }
  EXPECT_DOUBLE_EQ(c.steps.back().step_time_after_s, wp.step_time_s);
  EXPECT_TRUE(c.steps.back().fits_after);
  EXPECT_NE(c.lines.front().find("does not fit: it needs"), std::string::npos) << c.lines.front();
}

// Knobs that cannot change alone are grouped: stage 3 with offload -> stage 0 changes five knobs at once.
TEST(Explain, KnobsThatCannotChangeAloneAreGrouped) {
  const ModelProfile m = small_gpt();
  const auto ev = make_simulator(m, a100(1));
  const Plan winner = Plan::default_ddp(8, 64);
  Plan other = winner;
  other.zero_stage = 3;
  other.reshard_after_forward = true;
  other.offload = {true, true, true, 0};
  const PlanComparison c = compare_plans("runner-up", winner, ev->simulate(winner), other, nullptr, *ev,
                                         MemoryLimits{1LL << 50, 1LL << 50});
  ASSERT_EQ(c.steps.size(), 1u);
  EXPECT_EQ(c.steps[0].knobs, (std::vector<std::string>{"zero_stage", "reshard_after_forward", "offload_optimizer",
                                                         "offload_grads", "offload_params"}));
  EXPECT_TRUE(c.steps[0].simulated);
}

TEST(Explain, SamePlanSaysSo) {
  const ModelProfile m = small_gpt();
  const auto ev = make_simulator(m, a100(1));
  const Plan p = Plan::default_ddp(8, 64);
  const Prediction q = ev->simulate(p);
  const PlanComparison c = compare_plans("runner-up", p, q, p, &q, *ev, MemoryLimits{1LL << 50, 1LL << 50});
  EXPECT_TRUE(c.steps.empty());
  EXPECT_NE(c.lines.back().find("same plan"), std::string::npos);
}

}  // namespace
}  // namespace zeroplan::tuner
