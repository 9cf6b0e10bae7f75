#include "zeroplan/profiles/knobs.h"

#include <map>
#include <set>

#include "schema_test_util.h"

namespace zeroplan {
namespace {

using testing::expect_error;

// For every knob: a non-default value in range (command-line text), the knobs it needs to be valid, and
// the value Plan JSON then holds. A knob added to the registry without a row here fails the walk.
struct Case {
  std::vector<std::pair<std::string, std::string>> context;
  std::string text;
  nlohmann::json expected;
};

const std::map<std::string, Case>& cases() {
  using J = nlohmann::json;
  static const std::map<std::string, Case> c = {
      {"world_size", {{}, "4", 4}},
      {"global_batch", {{}, "16", 16}},
      {"micro_batch", {{}, "2", 2}},
      {"microbatches", {{}, "4", 4}},
      {"pipeline_stages", {{}, "2", 2}},
      {"pipeline.balance", {{{"pipeline_stages", "2"}}, "1,3", J::array({1, 3})}},
      {"pipeline.schedule", {{{"pipeline_stages", "2"}}, "1f1b", "1f1b"}},
      {"pipeline.checkpoint", {{{"pipeline_stages", "2"}}, "always", "always"}},
      {"zero_stage", {{}, "2", 2}},
      {"reshard_after_forward", {{{"zero_stage", "3"}}, "false", false}},
      {"offload.params", {{{"zero_stage", "3"}}, "true", true}},
      {"offload.grads", {{{"zero_stage", "1"}, {"offload.optimizer", "true"}}, "true", true}},
      {"offload.optimizer", {{{"zero_stage", "1"}}, "yes", true}},
      {"offload.activations_ratio", {{}, "0.25", 0.25}},
      {"offload.activations_prefetch_bytes", {{{"offload.activations_ratio", "0.5"}}, "1048576", 1048576}},
      {"offload_model.enabled", {{}, "true", true}},
      {"offload_model.slices", {{{"offload_model.enabled", "true"}}, "2", 2}},
      {"offload_model.checkpoint_activation", {{{"offload_model.enabled", "true"}}, "on", true}},
      {"offload_model.microbatches", {{{"offload_model.enabled", "true"}}, "2", 2}},
      {"checkpointing", {{}, "1,3", J::array({1, 3})}},
      {"checkpoint_offload", {{{"checkpointing", "all"}}, "true", true}},
      {"localsgd_frequency", {{}, "4", 4}},
      {"localsgd_warmup_steps", {{{"localsgd_frequency", "4"}}, "100", 100}},
      {"slowmo_momentum", {{{"localsgd_frequency", "4"}, {"slowmo_frequency", "8"}}, "0.5", 0.5}},
      {"slowmo_frequency", {{{"localsgd_frequency", "4"}}, "8", 8}},
      {"slowmo_lr", {{{"localsgd_frequency", "4"}, {"slowmo_frequency", "8"}}, "0.5", 0.5}},
      {"adascale", {{{"optimizer.name", "sgd"}}, "true", true}},
      {"precision.param_dtype", {{}, "bf16", "bf16"}},
      {"precision.compute_dtype", {{}, "fp16", "fp16"}},
      {"precision.reduce_dtype", {{}, "bf16", "bf16"}},
      {"precision.master_fp32", {{}, "false", false}},
      {"precision.broadcast_fp16", {{{"zero_stage", "1"}}, "true", true}},
      {"precision.fp32_reduce_scatter", {{{"zero_stage", "2"}}, "true", true}},
      {"precision.loss_scale", {{{"precision.compute_dtype", "fp16"}}, "dynamic", "dynamic"}},
      {"buckets.all_reduce_bucket_bytes", {{}, "1048576", 1048576}},
      {"buckets.reduce_buffer_elems", {{}, "65536", 65536}},
      {"buckets.allgather_bucket_bytes", {{}, "2097152", 2097152}},
      {"buckets.prefetch", {{}, "false", false}},
      {"buckets.prefetch_depth", {{{"zero_stage", "3"}}, "2", 2}},
      {"flat_params", {{}, "true", true}},
      {"optimizer.name", {{}, "sgd", "sgd"}},
      {"optimizer.lr", {{}, "0.01", 0.01}},
      {"optimizer.momentum", {{{"optimizer.name", "sgd"}}, "0.9", 0.9}},
      {"optimizer.betas", {{}, "0.8,0.95", J::array({0.8, 0.95})}},
      {"optimizer.eps", {{}, "1e-6", 1e-6}},
      {"optimizer.weight_decay", {{}, "0.1", 0.1}},
      {"optimizer.max_grad_norm", {{}, "1.5", 1.5}},
      {"seed", {{}, "42", 42}},
  };
  return c;
}

// What `--set` does (cli/src/plan_args.cpp): each text through the registry, then the dependent defaults.
Plan apply_sets(const Plan& base, const std::vector<std::pair<std::string, std::string>>& sets) {
  Plan plan = base;
  std::set<std::string> given;
  for (const auto& [key, text] : sets) {
    const Knob& k = knob(key, "--set");
    set_knob_text(plan, k, text, "--set");
    given.insert(k.name);
  }
  apply_dependent_defaults(base, plan, given);
  return plan;
}

Plan base() { return Plan::default_ddp(2, 8); }

TEST(Knobs, EveryKnobIsDescribedAndFoundByEverySpelling) {
  const nlohmann::json defaults = Plan{};
  std::set<std::string> names;
  for (const Knob& k : knobs()) {
    EXPECT_TRUE(names.insert(k.name).second) << "twice: " << k.name;
    EXPECT_FALSE(k.description.empty()) << k.name;
    EXPECT_FALSE(k.default_text.empty()) << k.name;
    EXPECT_NE(k.assign, nullptr) << k.name;
    EXPECT_TRUE(defaults.contains(nlohmann::json::json_pointer(k.json_pointer()))) << k.name << " is not a JSON path";
    EXPECT_EQ(find_knob(k.name), &k);
    for (const auto& a : k.aliases) EXPECT_EQ(find_knob(a), &k) << a;
  }
  EXPECT_EQ(find_knob("offload_params"), find_knob("offload.params"));
  EXPECT_EQ(find_knob("nope"), nullptr);
}

// Every knob: set through --set-style text, then through Plan JSON, and read back.
TEST(Knobs, EveryKnobRoundTripsThroughSetAndPlanJson) {
  for (const Knob& k : knobs()) {
    SCOPED_TRACE(k.name);
    ASSERT_TRUE(cases().contains(k.name)) << "no test value for knob " << k.name;
    const Case& c = cases().at(k.name);
    auto sets = c.context;
    sets.emplace_back(k.name, c.text);
    const Plan p = apply_sets(base(), sets);
    EXPECT_NE(knob_value(p, k), knob_value(apply_sets(base(), c.context), k)) << "the test value is the default";
    EXPECT_EQ(knob_value(p, k), c.expected);
    validate(p);
    const nlohmann::json j = p;
    const Plan q = j.get<Plan>();
    EXPECT_EQ(q, p);
    EXPECT_EQ(knob_value(q, k), c.expected);
  }
}

TEST(Knobs, BadTextNamesTheKnobAndWhatWasExpected) {
  Plan p = base();
  expect_error([&] { set_knob_text(p, knob("zero_stage"), "x", "--set"); }, "--set zero_stage=x: expected an integer");
  expect_error([&] { set_knob_text(p, knob("offload_params"), "maybe", "--set"); },
               "--set offload.params=maybe: expected true or false");
  expect_error([&] { set_knob_text(p, knob("precision.param_dtype"), "fp8", "--set"); },
               "--set precision.param_dtype=fp8: expected fp32, fp16 or bf16");
  expect_error([&] { set_knob_text(p, knob("pipeline.balance"), "even", "--set"); },
               "--set pipeline.balance=even: expected time, memory or units per stage (3,5)");
  expect_error([&] { set_knob_text(p, knob("checkpointing"), "3,1", "--set"); },
               "--set checkpointing=3,1: expected unit indices strictly increasing (3 then 1)");
}

TEST(Knobs, UnknownKnobIsOneLineWithTheCloseNames) {
  try {
    knob("offload.param", "--set offload.param=true");
    FAIL();
  } catch (const SchemaError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos);
    EXPECT_EQ(m.rfind("--set offload.param=true: unknown knob \"offload.param\"; close: ", 0), 0u) << m;
    EXPECT_NE(m.find("offload.params"), std::string::npos) << m;
  }
  // Nothing close: every name is listed.
  try {
    knob("qqqqqqqq", "--set");
    FAIL();
  } catch (const SchemaError& e) {
    EXPECT_NE(std::string(e.what()).find("knobs: world_size, global_batch,"), std::string::npos) << e.what();
  }
  EXPECT_EQ(close_knob_names("offload"),
            (std::vector<std::string>{"offload.params", "offload.grads", "offload.optimizer", "offload.activations_ratio",
                                      "offload.activations_prefetch_bytes"}));
}

// reshard_after_forward is true at stage 3 whether the stage came from JSON or from --set, unless given.
TEST(Knobs, DependentDefaultsAgreeBetweenJsonAndSet) {
  for (int stage = 0; stage <= 3; ++stage) {
    nlohmann::json j = base();
    j.erase("reshard_after_forward");
    j["zero_stage"] = stage;
    const Plan from_json = j.get<Plan>();
    const Plan from_set = apply_sets(base(), {{"zero_stage", std::to_string(stage)}});
    EXPECT_EQ(from_json, from_set) << "stage " << stage;
    EXPECT_EQ(from_set.reshard_after_forward, stage == 3);
  }
  // A user's value wins, from --set or from JSON.
  EXPECT_FALSE(apply_sets(base(), {{"zero_stage", "3"}, {"reshard_after_forward", "false"}}).reshard_after_forward);
  nlohmann::json j = base();
  j["zero_stage"] = 3;
  j["reshard_after_forward"] = false;
  EXPECT_FALSE(j.get<Plan>().reshard_after_forward);
  // A derived value follows: a stage-3 plan (resharding, as derived) set to stage 2 stops resharding; one
  // that chose not to reshard keeps its choice.
  const Plan stage3 = apply_sets(base(), {{"zero_stage", "3"}});
  EXPECT_FALSE(apply_sets(stage3, {{"zero_stage", "2"}}).reshard_after_forward);
  const Plan no_reshard = apply_sets(base(), {{"zero_stage", "3"}, {"reshard_after_forward", "false"}});
  EXPECT_FALSE(apply_sets(no_reshard, {{"offload.params", "true"}}).reshard_after_forward);
}

// pipeline.checkpoint follows fairscale Pipe's default (except_last) for GPipe stages, else never.
TEST(Knobs, PipelineCheckpointFollowsStagesScheduleAndCheckpointing) {
  const Plan two = apply_sets(base(), {{"pipeline_stages", "2"}});
  EXPECT_EQ(two.pipeline.checkpoint, "except_last");
  nlohmann::json j = two;
  j["pipeline"].erase("checkpoint");
  EXPECT_EQ(j.get<Plan>(), two);
  EXPECT_EQ(apply_sets(two, {{"pipeline.schedule", "1f1b"}}).pipeline.checkpoint, "never");
  EXPECT_EQ(apply_sets(two, {{"checkpointing", "all"}}).pipeline.checkpoint, "never");
  EXPECT_EQ(apply_sets(two, {{"pipeline_stages", "1"}}).pipeline.checkpoint, "never");
  const Plan always = apply_sets(two, {{"pipeline.checkpoint", "always"}});
  EXPECT_EQ(apply_sets(always, {{"micro_batch", "2"}}).pipeline.checkpoint, "always");  // a user's value is kept
}

TEST(Knobs, TheBatchSplitFollowsTheHalfThatIsGiven) {
  const Plan mb = apply_sets(base(), {{"micro_batch", "1"}});
  EXPECT_EQ(mb.microbatches, 4);
  const Plan acc = apply_sets(base(), {{"microbatches", "2"}});
  EXPECT_EQ(acc.micro_batch, 2);
  const Plan bigger = apply_sets(base(), {{"global_batch", "32"}});
  EXPECT_EQ(bigger.micro_batch, 16);
  EXPECT_EQ(bigger.microbatches, 1);
  const Plan both = apply_sets(base(), {{"micro_batch", "2"}, {"microbatches", "1"}});
  EXPECT_THROW(validate(both), SchemaError);  // 8 != 2 x 1 x 2: a user's values are kept as given
}

// The executor's list of what it does not run is the registry's (exec/src/step/executor.cpp asks it):
// each knob marked run: no is named when a plan uses it, and only those.
TEST(Knobs, RunRejectsExactlyTheKnobsMarkedNo) {
  const std::set<std::string> not_run = {};  // every knob runs since activation offload did (#13)
  EXPECT_TRUE(unsupported_knobs(base(), Component::run).empty());
  for (const Knob& k : knobs()) {
    SCOPED_TRACE(k.name);
    EXPECT_EQ(k.run == Support::no, not_run.contains(k.name));
    const Case& c = cases().at(k.name);
    auto sets = c.context;
    sets.emplace_back(k.name, c.text);
    const auto listed = unsupported_knobs(apply_sets(base(), sets), Component::run);
    bool named = false;
    for (const auto& line : listed) named = named || line.rfind(k.name + " ", 0) == 0;
    EXPECT_EQ(named, k.run == Support::no);
  }
  // Pipelines run (exec/src/step/pipeline.cpp).
  EXPECT_TRUE(unsupported_knobs(apply_sets(base(), {{"pipeline_stages", "2"}}), Component::run).empty());
  // OffloadModel's settings matter only when it is on.
  EXPECT_TRUE(unsupported_knobs(apply_sets(base(), {{"offload_model.slices", "2"}}), Component::run).empty());
  EXPECT_EQ(tune_knobs_supported_by(Component::run),
            "precision,zero_stage,reshard_after_forward,prefetch,offload_optimizer,offload_grads,offload_params,"
            "offload_model,checkpointing,checkpoint_offload,offload_activations,pipeline,micro_batch,localsgd,buckets,"
            "broadcast_fp16,"
            "fp32_reduce_scatter,adascale");
}

TEST(Knobs, TuneKnobsMoveRegistryKnobs) {
  std::set<std::string> dims;
  for (const TuneKnob& t : tune_knobs()) {
    EXPECT_TRUE(dims.insert(t.name).second) << t.name;
    EXPECT_FALSE(t.description.empty()) << t.name;
    EXPECT_FALSE(tune_knob_members(t.name).empty()) << t.name;
    for (const Knob* k : tune_knob_members(t.name)) EXPECT_NE(k->tune, Support::no) << k->name;
  }
  for (const Knob& k : knobs()) {
    if (!k.tune_knob.empty()) {
      EXPECT_TRUE(dims.contains(k.tune_knob)) << k.name << " -> " << k.tune_knob;
    }
  }
}

TEST(Knobs, TheFieldsTableListsEveryKnob) {
  const std::string text = knob_table_text();
  for (const Knob& k : knobs())
    EXPECT_NE(text.find("\n" + k.name + " "), std::string::npos) << k.name;
  const auto j = knob_table_json();
  ASSERT_EQ(j.at("knobs").size(), knobs().size());
  for (std::size_t i = 0; i < knobs().size(); ++i) {
    EXPECT_EQ(j["knobs"][i]["name"], knobs()[i].name);
    EXPECT_EQ(j["knobs"][i]["run"], std::string(support_name(knobs()[i].run)));
  }
  EXPECT_EQ(j.at("tune_knobs").size(), tune_knobs().size());
}

}  // namespace
}  // namespace zeroplan
