#include "zeroplan/tuner/space.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <stdexcept>

#include "../../tuner/src/space_internal.h"
#include "fixtures.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/profiles/knobs.h"
#include "zeroplan/tuner/explain.h"

namespace zeroplan::tuner {
namespace {

using testing::a100;
using testing::small_gpt;

TEST(Space, EveryCandidateIsAValidDistinctPlanThatSplitsTheBatch) {
  const ModelProfile m = small_gpt();
  const Space s = enumerate_space(m, a100(2), TuneConstraints{}.set_global_batch(64).set_allow_approximate_averaging(true));
  ASSERT_GT(s.candidates.size(), 100u);
  EXPECT_EQ(s.world_size, 16);
  std::set<std::string> seen;
  for (const Candidate& c : s.candidates) {
    EXPECT_NO_THROW(validate(c.plan, m));
    EXPECT_EQ(c.plan.micro_batch * c.plan.microbatches * c.plan.data_parallel_size(), 64);
    if (c.plan.pipeline_stages > 1) {
      EXPECT_LE(c.plan.zero_stage, 2);
      EXPECT_GE(c.plan.microbatches, c.plan.pipeline_stages);  // at least one microbatch per stage
    }
    EXPECT_TRUE(seen.insert(to_json_string(c.plan)).second) << "duplicate " << to_json_string(c.plan);
    if (c.plan.offload_model.enabled) {
      EXPECT_EQ(c.plan.zero_stage, 0);
      EXPECT_LE(c.plan.offload_model.slices, m.expanded_unit_count());
      EXPECT_FALSE(c.fit_activations);
    } else {
      EXPECT_TRUE(c.fit_activations);
      EXPECT_EQ(c.fit_checkpointing, c.plan.pipeline.checkpoint == "never");  // Pipe's checkpoint recomputes stages
    }
    if (c.plan.localsgd()) {
      EXPECT_EQ(c.plan.zero_stage, 0);
    }
  }
  // Pruned under validate's own messages (plan_rules()), whatever the numbers in them.
  auto pruned = [&](const std::string& start) {
    std::int64_t n = 0;
    for (const auto& [why, count] : s.invalid)
      if (why.rfind(start, 0) == 0) n += count;
    return n;
  };
  EXPECT_GT(pruned("plan: reshard_after_forward requires zero_stage 3 (got "), 0);
  EXPECT_GT(pruned("plan: offload.params requires zero_stage 3 (got "), 0);
  EXPECT_GT(pruned("plan: offload.grads requires offload.optimizer"), 0);
  EXPECT_GT(s.invalid_total(), 0);
  EXPECT_GT(pruned("plan: pipeline_stages 2 requires zero_stage 0, 1 or 2 (got 3)"), 0);
  std::set<std::string> pipelines;
  for (const Candidate& c : s.candidates)
    if (c.plan.pipeline_stages > 1)
      pipelines.insert(fmt::format("{} {} {}", c.plan.pipeline_stages, c.plan.pipeline.schedule, c.plan.pipeline.checkpoint));
  EXPECT_TRUE(pipelines.contains("2 1f1b never"));
  EXPECT_TRUE(pipelines.contains("4 gpipe except_last"));
  EXPECT_TRUE(pipelines.contains("4 gpipe always"));
}

// Each expansion step sets only the knobs step_knobs() lists for it (the plan rules are applied at the
// last step that sets a knob they read, by that list): every knob varied, LocalSGD and pipelines included,
// fp16 too (V100), and with fixed values; the check throws naming the step and the knob otherwise.
TEST(Space, EachExpansionStepSetsOnlyTheKnobsItLists) {
  space_detail::g_check_step_knobs = true;
  const ModelProfile m = small_gpt();
  for (const char* cluster : {"a100-sxm-80gb:1", "v100-sxm2-32gb:2"}) {
    TuneConstraints c;
    c.set_global_batch(64).set_allow_approximate_averaging(true).set_optimizer("sgd");
    EXPECT_NO_THROW(enumerate_space(m, resolve_cluster(cluster), c)) << cluster;
    c.fix("microbatches", "2");
    EXPECT_NO_THROW(enumerate_space(m, resolve_cluster(cluster), c)) << cluster;
  }
  std::map<std::string, std::int64_t> invalid;
  space_detail::Expander e({Plan{}}, invalid);
  EXPECT_THROW(e.expand<int>([](const Plan&) { return std::vector<int>{3}; }, [](Plan& p, const int& v) { p.zero_stage = v; },
                             space_detail::StepRule{space_detail::kReshard, {}}),
               std::logic_error)
      << "zero_stage set at the resharding step";
  space_detail::g_check_step_knobs = false;
}

TEST(Space, OnlyListedKnobsVaryAndFixedValuesHold) {
  const ModelProfile m = small_gpt();
  TuneConstraints c;
  c.set_global_batch(32).set_knobs({"zero_stage", "micro_batch"}).fix("precision", "bf16");
  const Space s = enumerate_space(m, a100(1), c);
  // 4 stages x divisors of 32 / 8 = 4 -> {1, 2, 4}
  EXPECT_EQ(s.candidates.size(), 12u);
  for (const Candidate& cand : s.candidates) {
    EXPECT_EQ(cand.plan.precision.param_dtype, "bf16");
    EXPECT_FALSE(cand.fit_activations);
    EXPECT_FALSE(cand.fit_checkpointing);
    EXPECT_FALSE(cand.plan.offload.optimizer);
  }
  c.set_knobs({}).fix("zero_stage", "3");
  for (const Candidate& cand : enumerate_space(m, a100(1), c).candidates) EXPECT_EQ(cand.plan.zero_stage, 3);
}

// The precision preset fixes every precision knob: with --fix precision=fp32 no candidate broadcasts in
// 16 bits or reduce-scatters in fp32, although both vary without it.
TEST(Space, FixingThePrecisionFixesItsBroadcastAndReduceScatterToo) {
  const ModelProfile m = small_gpt();
  TuneConstraints c;
  c.set_global_batch(32).set_knobs({"zero_stage", "broadcast_fp16", "fp32_reduce_scatter", "precision"});
  bool broadcasts = false;
  for (const Candidate& cand : enumerate_space(m, a100(1), c).candidates) broadcasts |= cand.plan.precision.broadcast_fp16;
  EXPECT_TRUE(broadcasts);
  c.fix("precision", "fp32");
  EXPECT_FALSE(c.varies("broadcast_fp16"));
  EXPECT_FALSE(c.varies("fp32_reduce_scatter"));
  for (const Candidate& cand : enumerate_space(m, a100(1), c).candidates) {
    EXPECT_EQ(precision_name(cand.plan.precision), "fp32");
  }
}

// checkpoint_offload varies only where checkpointing is on: enumerated beside a fixed checkpointing, fitted
// with a fitted one, never with none or OffloadModel.
TEST(Space, CheckpointOffloadOnlyWhereCheckpointingIsOn) {
  const ModelProfile m = small_gpt();
  TuneConstraints c;
  c.set_global_batch(32).set_knobs({"zero_stage", "checkpointing", "checkpoint_offload", "offload_model"});
  for (const Candidate& cand : enumerate_space(m, a100(1), c).candidates) {
    EXPECT_FALSE(cand.plan.checkpoint_offload);
    EXPECT_EQ(cand.fit_checkpoint_offload, !cand.plan.offload_model.enabled);
    EXPECT_EQ(cand.fit_checkpointing, !cand.plan.offload_model.enabled);
  }
  c.set_knobs({"zero_stage", "checkpoint_offload"}).fix("checkpointing", "all");
  const Space fixed = enumerate_space(m, a100(1), c);
  EXPECT_EQ(fixed.candidates.size(), 8u);  // 4 stages x kept on the device or on the host
  int offloaded = 0;
  for (const Candidate& cand : fixed.candidates) {
    offloaded += cand.plan.checkpoint_offload ? 1 : 0;
    EXPECT_FALSE(cand.fit_checkpoint_offload);
  }
  EXPECT_EQ(offloaded, 4);
  c.fix("checkpointing", "none");
  for (const Candidate& cand : enumerate_space(m, a100(1), c).candidates) EXPECT_FALSE(cand.plan.checkpoint_offload);
}

TEST(Space, WorldSizeUsesTheMostWholeNodesThatDivideTheBatch) {
  const Space s = enumerate_space(small_gpt(), a100(128), TuneConstraints{}.set_global_batch(1536).set_knobs({"zero_stage"}));
  EXPECT_EQ(s.world_size, 768);
  EXPECT_EQ(s.nodes_used, 96);
  EXPECT_EQ(s.nodes_available, 128);
  ASSERT_FALSE(s.notes.empty());
  EXPECT_NE(s.notes[0].find("using 96 nodes"), std::string::npos) << s.notes[0];
  try {
    enumerate_space(small_gpt(), a100(128), TuneConstraints{}.set_global_batch(1536).set_world_size(1024));
    FAIL();
  } catch (const SchemaError& e) {
    EXPECT_NE(std::string(e.what()).find("global_batch 1536 is not a multiple of world_size 1024"), std::string::npos);
  }
  EXPECT_THROW(enumerate_space(small_gpt(), a100(1), TuneConstraints{}.set_global_batch(16).set_world_size(16)), SchemaError);
}

TEST(Space, LocalSgdOnlyAcrossNodesAndOnlyWhenAllowed) {
  const ModelProfile m = small_gpt();
  auto count_localsgd = [&](const ClusterProfile& cl, bool allow) {
    int n = 0;
    for (const Candidate& c :
         enumerate_space(m, cl, TuneConstraints{}.set_global_batch(64).set_allow_approximate_averaging(allow)).candidates)
      n += c.plan.localsgd() ? 1 : 0;
    return n;
  };
  EXPECT_EQ(count_localsgd(a100(2), false), 0);
  EXPECT_EQ(count_localsgd(a100(1), true), 0);
  EXPECT_GT(count_localsgd(a100(2), true), 0);
}

TEST(Space, PrecisionsAreThoseTheDeviceSupports) {
  ClusterProfile c = a100(1);
  EXPECT_EQ(supported_precisions(c), (std::vector<std::string>{"fp32", "bf16", "fp16"}));
  c.device.peak_flops.erase("bf16");
  c.device.peak_flops.erase("fp16");
  EXPECT_EQ(supported_precisions(c), (std::vector<std::string>{"fp32"}));
}

// The tuner's knobs are the knob registry's tune knobs: every name the space and "why this plan" use is
// there (varies() and explain throw on one that is not), and --knobs / --fix read the registry's names.
TEST(Space, KnobNamesAreTheRegistrys) {
  std::vector<std::string> registry;
  for (const TuneKnob& t : tune_knobs()) registry.push_back(t.name);
  EXPECT_EQ(knob_names(), registry);
  EXPECT_NO_THROW(enumerate_space(small_gpt(), a100(2), TuneConstraints{}.set_global_batch(64).set_allow_approximate_averaging(true)));
  EXPECT_NO_THROW(differing_knobs(Plan{}, Plan{}));
  EXPECT_THROW(TuneConstraints{}.varies("offload.params"), std::logic_error);
  EXPECT_EQ(parse_knobs("offload.params, precision.param_dtype, prefetch"),
            (std::set<std::string>{"offload_params", "precision", "prefetch"}));
  EXPECT_EQ(parse_fix("offload_params=true").first, "offload.params");
  EXPECT_EQ(parse_fix("lr=0.1").first, "optimizer.lr");
  EXPECT_THROW(parse_fix("world_size=8"), SchemaError);
  for (const Knob& k : knobs()) {
    if (k.name == "world_size" || k.name == "global_batch") continue;
    const auto& keys = fixable_keys();
    EXPECT_TRUE(std::binary_search(keys.begin(), keys.end(), k.name)) << k.name;
  }
  // A fixed zero_stage 3 with reshard_after_forward not searched: it follows, as with --set.
  TuneConstraints c;
  c.set_global_batch(32).set_knobs({"micro_batch"}).fix("zero_stage", "3");
  const Space s = enumerate_space(small_gpt(), a100(1), c);
  ASSERT_FALSE(s.candidates.empty());
  for (const Candidate& cand : s.candidates) EXPECT_TRUE(cand.plan.reshard_after_forward);
}

}  // namespace
}  // namespace zeroplan::tuner
