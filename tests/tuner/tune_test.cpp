#include "zeroplan/tuner/tune.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <limits>
#include <mutex>

#include "fixtures.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/tuner/report.h"
#include "zeroplan/tuner/space.h"

namespace zeroplan::tuner {
namespace {

using testing::a100;
using testing::small_gpt;

// Headroom that leaves `fraction` of the default plan's simulated device peak available.
std::int64_t headroom_for(const ModelProfile& m, const ClusterProfile& cl, int global_batch, double fraction) {
  const Plan d = Plan::default_ddp(cl.world_size(), global_batch);
  const std::int64_t need = make_simulator(m, cl)->simulate(d).device.total_bytes();
  return cl.device.mem_bytes - static_cast<std::int64_t>(fraction * static_cast<double>(need));
}

// A small, memory-tight problem: the default needs more than the limit.
struct Tight {
  ModelProfile model = small_gpt();
  ClusterProfile cluster = a100(1);
  TuneConstraints constraints;
  Tight() {
    constraints.set_global_batch(64).set_device_headroom_bytes(headroom_for(model, cluster, 64, 0.6));
  }
};

TEST(Tune, PruningNeverRemovesTheTrueOptimum) {
  // Tight on model states: the limit is 80% of what the bound says the default's states alone need, so
  // the bound prunes every unsharded plan and the simulator decides the rest.
  Tight t;
  const std::int64_t states = make_simulator(t.model, t.cluster)->memory_lower_bound(Plan::default_ddp(8, 64)).device;
  t.constraints.set_device_headroom_bytes(t.cluster.device.mem_bytes - states * 8 / 10);
  t.constraints.set_knobs({"zero_stage", "reshard_after_forward", "offload_optimizer", "offload_grads", "offload_params",
                           "offload_activations", "checkpointing", "micro_batch", "precision"});
  const TuneResult pruned = tune(t.model, t.cluster, t.constraints, TuneOptions{}.set_threads(2).set_explain(false));
  const TuneResult full = tune(t.model, t.cluster, t.constraints, TuneOptions{}.set_threads(2).set_explain(false).set_prune(false));
  ASSERT_NE(pruned.best(), nullptr);
  ASSERT_NE(full.best(), nullptr);
  EXPECT_EQ(pruned.best()->plan, full.best()->plan);
  // The step-time bound leaves candidates that cannot be ranked unsimulated (dominated): fewer fitting
  // plans are known, the same ranking, its folded equivalents included.
  EXPECT_LE(pruned.fitting, full.fitting);
  EXPECT_GT(pruned.rejections.dominated, 0);
  EXPECT_EQ(full.rejections.dominated, 0);
  ASSERT_EQ(pruned.ranking.size(), full.ranking.size());
  for (std::size_t i = 0; i < pruned.ranking.size(); ++i) {
    EXPECT_EQ(pruned.ranking[i].plan, full.ranking[i].plan) << i;
    EXPECT_EQ(pruned.ranking[i].prediction.step_time_s, full.ranking[i].prediction.step_time_s) << i;
    EXPECT_EQ(pruned.ranking[i].equivalents, full.ranking[i].equivalents) << i;
  }
  EXPECT_GT(pruned.bound_prunes, 0);
  EXPECT_LT(pruned.simulations, full.simulations);

  // Brute force over the unpruned space, continuous knobs on a grid: nothing beats the winner.
  const auto ev = make_simulator(t.model, t.cluster);
  const MemoryLimits lim = pruned.limits;
  const Space space = enumerate_space(t.model, t.cluster, t.constraints);
  double best = std::numeric_limits<double>::infinity();
  Plan best_plan;
  int sims = 0;
  for (const Candidate& c : space.candidates) {
    const auto levels = c.fit_checkpointing ? checkpointing_levels(t.model) : std::vector<Checkpointing>{c.plan.checkpointing};
    for (const Checkpointing& level : levels) {
      for (int k = 0; k <= 10; ++k) {
        if (!c.fit_activations && k > 0) break;
        Plan p = c.plan;
        p.checkpointing = level;
        if (c.fit_activations) p.offload.activations_ratio = k / 10.0;
        const Prediction q = ev->simulate(p);
        ++sims;
        if (fits(q, lim) && q.step_time_s < best) {
          best = q.step_time_s;
          best_plan = p;
        }
      }
    }
  }
  EXPECT_LE(pruned.best()->prediction.step_time_s, best) << "brute force found a faster plan: " << to_json_string(best_plan);
  EXPECT_GT(sims, 100);
}

TEST(Tune, IdenticalInputsGiveByteIdenticalOutputAtAnyThreadCount) {
  Tight t;
  t.constraints.set_knobs({"zero_stage", "offload_optimizer", "offload_grads", "offload_activations", "checkpointing",
                           "micro_batch", "flat_params"});
  const TuneResult a = tune(t.model, t.cluster, t.constraints, TuneOptions{}.set_threads(1));
  const TuneResult b = tune(t.model, t.cluster, t.constraints, TuneOptions{}.set_threads(3));
  const TuneResult c = tune(t.model, t.cluster, t.constraints, TuneOptions{}.set_threads(2));
  EXPECT_EQ(tune_json(a), tune_json(b));
  EXPECT_EQ(tune_json(a), tune_json(c));
  EXPECT_EQ(report_markdown(a), report_markdown(b));
  EXPECT_EQ(report_html(a), report_html(b));
}

TEST(Tune, OnATightCaseTheWinnerIsAPlanTheDefaultCannotRunAndTheReportSaysWhy) {
  Tight t;
  const TuneResult r = tune(t.model, t.cluster, t.constraints, TuneOptions{}.set_threads(2));
  ASSERT_NE(r.best(), nullptr);
  const DefaultCheck& d = r.default_plan;
  ASSERT_TRUE(d.valid);
  ASSERT_TRUE(d.simulated);
  EXPECT_FALSE(d.fits);
  EXPECT_GT(d.device_needed_bytes, d.device_available_bytes);
  EXPECT_EQ(d.device_available_bytes, r.limits.device_bytes);
  EXPECT_NE(r.best()->plan, d.plan);
  EXPECT_LE(r.best()->prediction.device.total_bytes(), r.limits.device_bytes);

  const std::string md = report_markdown(r);
  EXPECT_NE(md.find("The default does not fit"), std::string::npos);
  EXPECT_NE(md.find(fmt::format("({} bytes) per rank", d.device_needed_bytes)), std::string::npos) << md;
  EXPECT_NE(md.find(fmt::format("({} bytes) available", d.device_available_bytes)), std::string::npos) << md;
  // "Why this plan" walks from the default to the winner and ends fitting.
  const PlanComparison* vs_default = nullptr;
  for (const auto& c : r.explanation.comparisons)
    if (c.against == "default") vs_default = &c;
  ASSERT_NE(vs_default, nullptr);
  EXPECT_FALSE(vs_default->other_fits);
  ASSERT_FALSE(vs_default->steps.empty());
  EXPECT_TRUE(vs_default->steps.back().fits_after);
  EXPECT_NE(vs_default->lines.front().find("does not fit: it needs"), std::string::npos) << vs_default->lines.front();
  const std::string json = tune_json(r);
  EXPECT_NE(json.find("\"device_needed_bytes\": " + std::to_string(d.device_needed_bytes)), std::string::npos);
}

TEST(Tune, ProgressReachesTheTotal) {
  Tight t;
  t.constraints.set_knobs({"zero_stage", "micro_batch"});
  std::mutex mu;
  std::vector<Progress> seen;
  const TuneResult r = tune(t.model, t.cluster, t.constraints,
                            TuneOptions{}.set_threads(2).set_progress([&](const Progress& p) {
                              std::lock_guard lock(mu);
                              seen.push_back(p);
                            }));
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().done, seen.back().total);
  EXPECT_EQ(seen.back().total, r.candidates);
  EXPECT_EQ(seen.back().simulations, r.simulations);
}

TEST(Tune, WhenNothingFitsTheClosestMissesSayByHowMuch) {
  const ModelProfile m = small_gpt();
  const ClusterProfile cl = a100(1);
  TuneConstraints c;
  c.set_global_batch(8).set_knobs({"zero_stage", "micro_batch"}).set_device_headroom_bytes(cl.device.mem_bytes - (1 << 20));
  const TuneResult r = tune(m, cl, c);
  EXPECT_EQ(r.best(), nullptr);
  EXPECT_EQ(r.fitting, 0);
  ASSERT_FALSE(r.rejections.closest.empty());
  EXPECT_GT(r.rejections.closest.front().device_excess_bytes, 0);
  EXPECT_NE(report_markdown(r).find("No plan fits"), std::string::npos);
}

// The simulator, blind to bucket sizes: every bucket variant of a plan predicts what the plan with the
// default buckets predicts, as happens for a model whose gradients fit one bucket either way.
class BucketBlind final : public Evaluator {
 public:
  explicit BucketBlind(const Evaluator& inner) : inner_(inner) {}
  Prediction simulate(const Plan& plan) const override { return inner_.simulate(default_buckets(plan)); }
  MemoryBytes memory_lower_bound(const Plan& plan) const override { return inner_.memory_lower_bound(default_buckets(plan)); }

 private:
  static Plan default_buckets(Plan p) {
    p.buckets = Buckets{};
    return p;
  }
  const Evaluator& inner_;
};

TEST(Tune, PlansPredictingTheSameAreRankedOnceWithTheirVariantsNamed) {
  const ModelProfile model = small_gpt();
  const ClusterProfile cluster = a100(1);
  TuneConstraints constraints;
  constraints.set_global_batch(64).set_knobs({"zero_stage", "buckets"});
  const auto sim = make_simulator(model, cluster);
  const BucketBlind blind(*sim);
  const TuneResult r = tune(model, cluster, constraints, TuneOptions{}.set_threads(2).set_evaluator(&blind));
  ASSERT_GE(r.ranking.size(), 2u);
  int folded = 0;
  for (std::size_t i = 0; i < r.ranking.size(); ++i) {
    const RankedPlan& p = r.ranking[i];
    // The default buckets represent their group; the large-bucket twins are folded into it.
    EXPECT_EQ(p.plan.buckets, Buckets{}) << i;
    if (i > 0) {
      EXPECT_TRUE(faster(r.ranking[i - 1].prediction, p.prediction)) << "rows " << i - 1 << " and " << i << " predict the same";
    }
    if (p.equivalents > 0) {
      ++folded;
      EXPECT_EQ(p.equivalent_knobs, std::vector<std::string>{"buckets"});
    }
  }
  EXPECT_GT(folded, 0);
  const std::string md = report_markdown(r);
  EXPECT_NE(md.find("more plan differing in buckets: the same prediction)"), std::string::npos) << md;
  EXPECT_NE(tune_json(r).find("\"equivalent_knobs\": [\n"), std::string::npos);
  // The runner-up the explanation walks from is a real alternative, not a bucket twin.
  ASSERT_FALSE(r.explanation.comparisons.empty());
  EXPECT_EQ(r.explanation.comparisons.front().against, "runner-up");
  EXPECT_NE(r.explanation.comparisons.front().other.zero_stage, r.best()->plan.zero_stage);
}

}  // namespace
}  // namespace zeroplan::tuner
