// What `run` checks before any rank starts (exec::check_plan_runs, which every rank checks again) refuses
// each rule between knobs with the one message validate throws (tests/tuner/plan_rules_test.cpp: validate
// and the tuner).
#include <gtest/gtest.h>

#include <string>

#include "plan_rule_cases.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/exec/run.h"
#include "zeroplan/profiles/knobs.h"

namespace zeroplan::exec {
namespace {

// What run checks before any rank starts refuses `p` with exactly `message` (`what` names the rule).
void expect_run_refuses(const Plan& p, const std::string& message, const std::string& what) {
  try {
    check_plan_runs(p);
    ADD_FAILURE() << what << ": run accepted the plan";
  } catch (const ExecError& e) {
    EXPECT_EQ(std::string(e.what()), message) << what;
  }
}

TEST(PlanRules, RunRefusesEachRuleWithItsOneMessage) {
  const std::vector<PlanRule>& rules = plan_rules();
  const auto cases = zeroplan::testing::plan_rule_cases();
  ASSERT_EQ(cases.size(), rules.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    Plan p = zeroplan::testing::rule_case_base();
    cases[i](p);
    expect_run_refuses(p, plan_rule_message(rules[i].broken(p)), "rule " + std::to_string(i));
  }
}

// The executor's refusals of valid plans (the registry's run rules, listed by `plan --fields`): each is
// refused before any rank starts with its rule's one line, and only by it (validate accepts the plan).
TEST(PlanRules, RunRefusesEachRunRuleWithItsOneLine) {
  const std::vector<RunRule>& rules = run_rules();
  const auto cases = zeroplan::testing::run_rule_cases();
  ASSERT_EQ(cases.size(), rules.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    Plan p = zeroplan::testing::rule_case_base();
    cases[i](p);
    EXPECT_NO_THROW(validate(p)) << "run rule " << i << " (" << rules[i].refuses << "): the plan is valid";
    for (std::size_t j = 0; j < i; ++j) EXPECT_EQ(rules[j].broken(p), "") << "run rule " << i << " breaks rule " << j;
    const std::string line = rules[i].broken(p);
    ASSERT_FALSE(line.empty()) << "run rule " << i << " (" << rules[i].refuses << ")";
    expect_run_refuses(p, line, "run rule " + std::to_string(i));
  }
}

}  // namespace
}  // namespace zeroplan::exec
