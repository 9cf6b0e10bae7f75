// Each rule between knobs is stated once (profiles' plan_rules()): validate throws its message, and the
// tuner, with the knobs a breaking plan sets fixed to its values, prunes the plans that break it under the
// same message (or refuses the fixed values with it) and ranks none that does. The executor's side is tests/exec/step/plan_rules_test.cpp.
#include <gtest/gtest.h>

#include <string>

#include "fixtures.h"
#include "plan_rule_cases.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/profiles/knobs.h"
#include "zeroplan/tuner/space.h"

namespace zeroplan::tuner {
namespace {

TEST(PlanRules, ValidateAndTheTunerRefuseEachRuleWithItsOneMessage) {
  const std::vector<PlanRule>& rules = plan_rules();
  const auto cases = zeroplan::testing::plan_rule_cases();
  ASSERT_EQ(cases.size(), rules.size()) << "one case per rule";
  const ModelProfile m = testing::small_gpt();
  int tuner_checked = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    Plan p = zeroplan::testing::rule_case_base();
    cases[i](p);
    SCOPED_TRACE("rule " + std::to_string(i) + ": " + to_json_string(p));
    for (std::size_t j = 0; j < i; ++j) EXPECT_EQ(rules[j].broken(p), "") << "the case of rule " << i << " breaks rule " << j;
    const std::string reason = rules[i].broken(p);
    ASSERT_FALSE(reason.empty()) << "the case does not break its rule";
    const std::string message = plan_rule_message(reason);
    try {
      validate(p);
      ADD_FAILURE() << "validate accepted it";
    } catch (const SchemaError& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
    // The tuner: the rule's knobs fixed to the case's values (the rest searched).
    TuneConstraints c;
    c.set_global_batch(p.global_batch).set_world_size(p.world_size).set_allow_approximate_averaging(true);
    c.set_optimizer(p.optimizer.name);
    bool expressible = true;
    for (const std::string& k : rules[i].knobs)
      expressible = expressible && k != "world_size" && k != "global_batch" && find_knob(k) != nullptr;
    if (!expressible) continue;
    // Every knob the case set (the rule's and the others it needs), as --fix would give them.
    const Plan base = zeroplan::testing::rule_case_base();
    for (const Knob& knob : knobs()) {
      if (knob.name == "world_size" || knob.name == "global_batch") continue;
      const nlohmann::json v = knob_value(p, knob);
      if (v != knob_value(base, knob)) c.fix(knob.name, v.is_string() ? v.get<std::string>() : v.dump());
    }
    ++tuner_checked;
    try {
      const Space s = enumerate_space(m, testing::a100(1), c);
      // Plans that vary another knob the rule reads may hold it (offload.optimizer at stages 1-3); none breaks it.
      // (A candidate whose checkpointing or activation ratio is fitted is checked against the fitted values.)
      for (const Candidate& cand : s.candidates) {
        if (cand.fit_checkpointing || cand.fit_activations) continue;
        EXPECT_EQ(rules[i].broken(cand.plan), "") << to_json_string(cand.plan);
      }
      std::string counted;
      for (const auto& [why, n] : s.invalid) counted += "\n  " + why;
      EXPECT_GT(s.invalid.count(message), 0u) << "the tuner did not count \"" << message << "\"; it counted:" << counted;
    } catch (const SchemaError& e) {
      EXPECT_EQ(std::string(e.what()), message) << "the tuner refused the fixed values otherwise";
    }
  }
  EXPECT_GE(tuner_checked, 25);
}

// The executor's refusals (run_rules): with TuneConstraints::runnable (autopilot's) the tuner, with each
// case's knobs fixed, proposes no plan that breaks the rule and counts it under "run: <its line>" (or
// refuses the fixed values with that line); without it the case's plans are searched as any valid plan.
TEST(PlanRules, TheRunnableTunerPrunesEachRunRule) {
  const std::vector<RunRule>& rules = run_rules();
  const auto cases = zeroplan::testing::run_rule_cases();
  ASSERT_EQ(cases.size(), rules.size()) << "one case per run rule";
  const ModelProfile m = testing::small_gpt();
  for (std::size_t i = 0; i < cases.size(); ++i) {
    Plan p = zeroplan::testing::rule_case_base();
    cases[i](p);
    SCOPED_TRACE("run rule " + std::to_string(i) + ": " + rules[i].refuses);
    const std::string message = "run: " + rules[i].broken(p);
    const Plan base = zeroplan::testing::rule_case_base();
    TuneConstraints c;
    c.set_global_batch(p.global_batch).set_world_size(p.world_size).set_allow_approximate_averaging(true);
    c.set_optimizer(p.optimizer.name);
    for (const Knob& knob : knobs()) {
      if (knob.name == "world_size" || knob.name == "global_batch" || knob.name == "optimizer.name") continue;
      const nlohmann::json v = knob_value(p, knob);
      if (v != knob_value(base, knob)) c.fix(knob.name, v.is_string() ? v.get<std::string>() : v.dump());
    }
    std::size_t breaking = 0;
    for (const Candidate& cand : enumerate_space(m, testing::a100(1), c).candidates) breaking += !rules[i].broken(cand.plan).empty();
    EXPECT_GT(breaking, 0u) << "without runnable the case's plans are candidates";
    c.set_runnable(true);
    try {
      const Space s = enumerate_space(m, testing::a100(1), c);
      for (const Candidate& cand : s.candidates) EXPECT_EQ(rules[i].broken(cand.plan), "") << to_json_string(cand.plan);
      EXPECT_GT(s.invalid.count(message), 0u) << "not counted: " << message;
    } catch (const SchemaError& e) {
      EXPECT_EQ(std::string(e.what()), message) << "the tuner refused the fixed values otherwise";
    }
  }
}

}  // namespace
}  // namespace zeroplan::tuner
