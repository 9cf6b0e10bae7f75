#include "zeroplan/tuner/search.h"

#include <gtest/gtest.h>

#include <cmath>

#include "fixtures.h"
#include "zeroplan/tuner/space.h"

namespace zeroplan::tuner {
namespace {

using testing::a100;
using testing::CountingEvaluator;
using testing::small_gpt;

// Memory falls linearly with the activation ratio and with checkpointing; time rises with both.
class LinearFake final : public Evaluator {
 public:
  std::int64_t base = 1000, activations = 600, checkpoint_saves = 300, host_per_ratio = 100;
  Prediction simulate(const Plan& p) const override {
    Prediction q;
    q.plan = p;
    const double ck = p.checkpointing.mode == Checkpointing::Mode::none ? 0 : 1;
    q.device.peak_bytes = base - static_cast<std::int64_t>(std::llround(p.offload.activations_ratio * activations)) -
                          static_cast<std::int64_t>(ck * checkpoint_saves);
    q.host.peak_bytes = static_cast<std::int64_t>(std::llround(p.offload.activations_ratio * host_per_ratio));
    q.step_time_s = 1 + 0.5 * p.offload.activations_ratio + 0.1 * ck;
    q.samples_per_s = p.global_batch / q.step_time_s;
    return q;
  }
  MemoryBytes memory_lower_bound(const Plan&) const override { return {}; }
};

Candidate free_candidate() {
  Candidate c;
  c.plan.checkpointing = Checkpointing{};
  c.fit_activations = true;
  return c;
}

TEST(Search, FindsTheSmallestFittingRatioOnTheGridInFewSimulations) {
  const LinearFake fake;
  CountingEvaluator ev(fake);
  const ModelProfile m = small_gpt();
  for (std::int64_t limit : {1000, 999, 820, 777, 401, 400, 399}) {
    ev.simulations = 0;
    const Outcome o = evaluate_candidate(free_candidate(), m, ev, MemoryLimits{limit, 1 << 20});
    if (limit < 400) {
      EXPECT_EQ(o.status, Status::out_of_memory) << limit;
      EXPECT_EQ(o.device_excess_bytes, 400 - limit);
      continue;
    }
    ASSERT_EQ(o.status, Status::fits) << limit;
    // Smallest k/100 with 1000 - 600 k/100 <= limit.
    const int k = static_cast<int>(std::ceil((1000.0 - static_cast<double>(limit)) / 6.0 - 1e-9));
    EXPECT_DOUBLE_EQ(o.plan.offload.activations_ratio, k / 100.0) << limit;
    EXPECT_LE(o.simulations, 6) << limit;
  }
}

TEST(Search, CheckpointingIsTriedWhenOffloadAloneCannotFitAndTheCheaperWins) {
  LinearFake fake;
  fake.activations = 200;  // ratio 1 saves 200, checkpointing 300
  Candidate c = free_candidate();
  c.fit_checkpointing = true;
  const ModelProfile m = small_gpt();
  // Needs 250 saved: offload alone cannot, checkpointing (+0.1 s) can at ratio 0.
  Outcome o = evaluate_candidate(c, m, fake, MemoryLimits{750, 1 << 20});
  ASSERT_EQ(o.status, Status::fits);
  EXPECT_NE(o.plan.checkpointing.mode, Checkpointing::Mode::none);
  EXPECT_DOUBLE_EQ(o.plan.offload.activations_ratio, 0);
  // Needs 100: offload 0.5 costs +0.25 s, checkpointing +0.1 s: checkpointing wins.
  o = evaluate_candidate(c, m, fake, MemoryLimits{900, 1 << 20});
  EXPECT_NE(o.plan.checkpointing.mode, Checkpointing::Mode::none);
  // Needs 10: offload 0.05 costs +0.025 s, cheaper than checkpointing.
  o = evaluate_candidate(c, m, fake, MemoryLimits{990, 1 << 20});
  EXPECT_EQ(o.plan.checkpointing.mode, Checkpointing::Mode::none);
  EXPECT_DOUBLE_EQ(o.plan.offload.activations_ratio, 0.05);
}

// Checkpoint offload at a level (copies, +0.05 s, 150 more saved, 150 on the host) is tried before the
// next level's recompute; the fastest variant that fits wins, and none without checkpointing is offloaded.
TEST(Search, CheckpointOffloadIsTriedAtEachLevelBeforeCheckpointingMore) {
  struct Fake final : Evaluator {
    Prediction simulate(const Plan& p) const override {
      EXPECT_FALSE(p.checkpoint_offload && p.checkpointing.mode == Checkpointing::Mode::none) << "nothing to offload";
      Prediction q;
      q.plan = p;
      const std::size_t units = p.checkpointing.mode == Checkpointing::Mode::all   ? 3
                                : p.checkpointing.mode == Checkpointing::Mode::none ? 0
                                                                                    : p.checkpointing.units.size();
      q.device.peak_bytes = 1000 - 100 * static_cast<std::int64_t>(units) - (p.checkpoint_offload ? 150 : 0);
      q.host.peak_bytes = p.checkpoint_offload ? 150 : 0;
      q.step_time_s = 1 + 0.1 * static_cast<double>(units) + (p.checkpoint_offload ? 0.05 : 0);
      q.samples_per_s = p.global_batch / q.step_time_s;
      return q;
    }
    MemoryBytes memory_lower_bound(const Plan&) const override { return {}; }
  } fake;
  Candidate c;
  c.fit_checkpointing = c.fit_checkpoint_offload = true;
  const ModelProfile m = small_gpt();
  ASSERT_GE(checkpointing_levels(m).size(), 3u);
  // 250 to save: the first level with its inputs on the host (100 + 150) beats checkpointing 3 levels.
  Outcome o = evaluate_candidate(c, m, fake, MemoryLimits{750, 1 << 20});
  ASSERT_EQ(o.status, Status::fits);
  EXPECT_TRUE(o.plan.checkpoint_offload);
  EXPECT_EQ(checkpointing_levels(m)[1], o.plan.checkpointing);
  // 100 to save: the first level alone fits; nothing is offloaded.
  o = evaluate_candidate(c, m, fake, MemoryLimits{900, 1 << 20});
  EXPECT_FALSE(o.plan.checkpoint_offload);
  // No host room: offload never fits; checkpointing one more unit does.
  o = evaluate_candidate(c, m, fake, MemoryLimits{800, 100});
  ASSERT_EQ(o.status, Status::fits);
  EXPECT_FALSE(o.plan.checkpoint_offload);
  EXPECT_EQ(checkpointing_levels(m)[2], o.plan.checkpointing);
  // Not asked to fit it: never offloaded.
  c.fit_checkpoint_offload = false;
  o = evaluate_candidate(c, m, fake, MemoryLimits{750, 1 << 20});
  EXPECT_FALSE(o.plan.checkpoint_offload);
}

// LinearFake's simulations, counted; the bounds are the subclass's.
class CountingFake : public Evaluator {
 public:
  LinearFake inner;
  mutable int simulations = 0;
  Prediction simulate(const Plan& p) const override {
    ++simulations;
    return inner.simulate(p);
  }
};

// The fake's step-time bound: its step time at ratio 0 (checkpointing adds 0.1 s).
class BoundedFake final : public CountingFake {
 public:
  MemoryBytes memory_lower_bound(const Plan&) const override { return {}; }
  double step_time_lower_bound(const Plan& p) const override {
    return p.checkpointing.mode == Checkpointing::Mode::none ? 1.0 : 1.1;
  }
};

TEST(Search, VariantsAboveTheRankingCutoffAreNotSimulated) {
  BoundedFake fake;
  fake.inner.activations = 0;  // only checkpointing saves memory
  const BoundedFake& ev = fake;
  Candidate c = free_candidate();
  c.fit_checkpointing = true;
  const ModelProfile m = small_gpt();
  const MemoryLimits needs_checkpointing{800, 1 << 20};
  SearchOptions opt;
  const Outcome all = evaluate_candidate(c, m, ev, needs_checkpointing, opt);
  ASSERT_EQ(all.status, Status::fits);
  EXPECT_DOUBLE_EQ(all.prediction.step_time_s, 1.1);
  // Top_k plans at 1.05 s: no checkpointed variant can be ranked, so none is simulated and the candidate
  // (its one variant without checkpointing does not fit) is dominated.
  opt.rank_cutoff_s = 1.05;
  fake.simulations = 0;
  const Outcome cut = evaluate_candidate(c, m, ev, needs_checkpointing, opt);
  EXPECT_EQ(cut.status, Status::dominated);
  EXPECT_EQ(cut.plan, c.plan);
  EXPECT_LT(ev.simulations, all.simulations);
  EXPECT_EQ(ev.simulations, cut.simulations);
  // A cutoff above the checkpointed bound changes nothing; without pruning the cutoff is ignored.
  opt.rank_cutoff_s = 1.2;
  EXPECT_EQ(evaluate_candidate(c, m, ev, needs_checkpointing, opt).status, Status::fits);
  opt.rank_cutoff_s = 1.05;
  opt.prune = false;
  EXPECT_EQ(evaluate_candidate(c, m, ev, needs_checkpointing, opt).status, Status::fits);
}

// LinearFake's exact bounds: memory and step time as simulated (device memory falls, time rises with the
// ratio, as the search assumes of every evaluator's bounds).
class RatioBoundedFake final : public CountingFake {
 public:
  MemoryBytes memory_lower_bound(const Plan& p) const override {
    const Prediction q = inner.simulate(p);
    return {q.device.total_bytes(), q.host.total_bytes()};
  }
  double step_time_lower_bound(const Plan& p) const override { return inner.simulate(p).step_time_s; }
};

TEST(Search, OffloadRatiosThatCannotBeRankedAreNotSimulated) {
  RatioBoundedFake fake;
  const RatioBoundedFake& ev = fake;
  const ModelProfile m = small_gpt();
  const MemoryLimits limits{820, 1 << 20};  // ratio 0.30 at least (1.15 s); checkpointing alone fits (1.1 s)
  SearchOptions opt;
  const Outcome all = evaluate_candidate(free_candidate(), m, ev, limits, opt);
  ASSERT_EQ(all.status, Status::fits);
  EXPECT_DOUBLE_EQ(all.plan.offload.activations_ratio, 0.30);
  // Top_k plans at 1.12 s: every ratio that fits is bounded above them, so none is simulated.
  opt.rank_cutoff_s = 1.12;
  fake.simulations = 0;
  const Outcome cut = evaluate_candidate(free_candidate(), m, ev, limits, opt);
  EXPECT_EQ(cut.status, Status::dominated);
  EXPECT_EQ(cut.simulations, 0);
  EXPECT_EQ(fake.simulations, 0);
  // A cutoff above the fitting ratio's bound, or no pruning, finds it.
  opt.rank_cutoff_s = 1.16;
  EXPECT_DOUBLE_EQ(evaluate_candidate(free_candidate(), m, ev, limits, opt).plan.offload.activations_ratio, 0.30);
  opt.rank_cutoff_s = 1.12;
  opt.prune = false;
  EXPECT_EQ(evaluate_candidate(free_candidate(), m, ev, limits, opt).status, Status::fits);
  // With checkpointing free the cut level is passed over, not the candidate: the next level (no offload,
  // 1.1 s) is what an unpruned search ranks too, in fewer simulations.
  Candidate c = free_candidate();
  c.fit_checkpointing = true;
  opt.prune = true;
  fake.simulations = 0;
  const Outcome pruned = evaluate_candidate(c, m, ev, limits, opt);
  opt.prune = false;
  const Outcome full = evaluate_candidate(c, m, ev, limits, opt);
  ASSERT_EQ(pruned.status, Status::fits);
  ASSERT_EQ(full.status, Status::fits);
  EXPECT_EQ(pruned.plan, full.plan);
  EXPECT_DOUBLE_EQ(pruned.prediction.step_time_s, 1.1);
  EXPECT_LT(pruned.simulations, full.simulations);
}

TEST(Search, HostLimitStopsOffloadEarly) {
  const LinearFake fake;
  // Device needs ratio >= 0.5 (host 50), host allows 40: nothing fits.
  const Outcome o = evaluate_candidate(free_candidate(), small_gpt(), fake, MemoryLimits{700, 40});
  EXPECT_EQ(o.status, Status::out_of_memory);
}

TEST(Search, CheckpointingLevelsStartWithNoneAndGrow) {
  const ModelProfile m = small_gpt();
  const auto levels = checkpointing_levels(m);
  ASSERT_GE(levels.size(), 2u);
  EXPECT_EQ(levels.front().mode, Checkpointing::Mode::none);
  for (std::size_t i = 2; i < levels.size(); ++i) {
    if (levels[i].mode == Checkpointing::Mode::all) continue;
    EXPECT_EQ(levels[i].units.size(), levels[i - 1].units.size() + 1);
  }
}

// The analytic bound is never above the simulated peak, over the variants the search tries.
TEST(Search, MemoryBoundIsALowerBoundOfTheSimulatedPeak) {
  const ModelProfile m = small_gpt();
  const ClusterProfile cl = a100(2);
  const auto ev = make_simulator(m, cl);
  const Space s = enumerate_space(m, cl, TuneConstraints{}.set_global_batch(32).set_allow_approximate_averaging(true));
  const auto levels = checkpointing_levels(m);
  int checked = 0;
  for (std::size_t i = 0; i < s.candidates.size(); i += 3) {
    Plan p = s.candidates[i].plan;
    for (double ratio : {0.0, 0.5, 1.0}) {
      if (s.candidates[i].fit_activations) p.offload.activations_ratio = ratio;
      if (s.candidates[i].fit_checkpointing) p.checkpointing = levels[checked % levels.size()];
      const MemoryBytes b = ev->memory_lower_bound(p);
      const Prediction q = ev->simulate(p);
      ASSERT_LE(b.device, q.device.total_bytes()) << to_string(Status::fits) << " plan " << i;
      ASSERT_LE(b.host, q.host.total_bytes()) << "plan " << i;
      if (!p.offload_model.enabled) {  // OffloadModel keeps nothing resident on the device
        EXPECT_GT(b.device, 0);
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 300);
}

// On the real simulator, the fitted ratio fits and one grid step less does not.
TEST(Search, FittedRatioIsTheSmallestThatFitsOnTheSimulator) {
  const ModelProfile m = small_gpt(4, 512);
  const ClusterProfile cl = a100(1);
  const auto ev = make_simulator(m, cl);
  Candidate c;
  c.plan = Plan::default_ddp(8, 8 * 16);
  c.fit_activations = true;
  const Prediction at0 = ev->simulate(c.plan);
  Plan p1 = c.plan;
  p1.offload.activations_ratio = 1;
  const Prediction at1 = ev->simulate(p1);
  ASSERT_LT(at1.device.total_bytes(), at0.device.total_bytes());
  // A limit a third of the way between ratio 1 and ratio 0.
  const std::int64_t limit = at1.device.total_bytes() + (at0.device.total_bytes() - at1.device.total_bytes()) / 3;
  const MemoryLimits lim{limit, 1LL << 50};
  const Outcome o = evaluate_candidate(c, m, *ev, lim);
  ASSERT_EQ(o.status, Status::fits);
  const double r = o.plan.offload.activations_ratio;
  EXPECT_GT(r, 0);
  EXPECT_LT(r, 1);
  Plan less = o.plan;
  less.offload.activations_ratio = std::round((r - kRatioStep) * 100) / 100;
  EXPECT_GT(ev->simulate(less).device.total_bytes(), limit);
  // The two ends, then interpolation guesses kept inside the bracket: never more than bisection's
  // ceil(log2(1 / kRatioStep)) steps.
  EXPECT_LE(o.simulations, 2 + static_cast<int>(std::ceil(std::log2(1 / kRatioStep))));
}

}  // namespace
}  // namespace zeroplan::tuner
