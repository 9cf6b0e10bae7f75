#include "zeroplan/profiles/comparison.h"

#include "schema_test_util.h"

namespace zeroplan {
namespace {

using testing::expect_error;
using testing::sample_comparison;

TEST(Comparison, RoundTrip) {
  validate(sample_comparison());
  testing::expect_round_trip(sample_comparison());
}

TEST(Comparison, RelativeErrorAndVerdict) {
  EXPECT_NEAR(relative_error(0.21, 0.2), 0.05, 1e-12);
  EXPECT_DOUBLE_EQ(relative_error(0.1, 0.2), -0.5);
  EXPECT_EQ(relative_error(0, 0), 0);
  EXPECT_EQ(relative_error(3, 0), 1);
  EXPECT_EQ(relative_error(-3, 0), -1);
  const Comparison c = sample_comparison();
  EXPECT_EQ(c.verdict, "pass");  // the -75% optimizer phase does not gate
  std::vector<Metric> metrics = c.metrics;
  metrics[2].gating = true;
  EXPECT_EQ(verdict_for(metrics, 0.2), "fail");
  EXPECT_EQ(verdict_for(metrics, 0.75), "pass");
}

// The same prediction (step 1.0 s) against a run measured at 1.3 s (-23%, tolerance 10%): a run whose
// own steps spread from 1.0 to 1.4 s says the error is within its noise; a tight run (1.25-1.35 s) on a
// quiet machine fails; the same on a busy machine is not judged; memory out of tolerance always fails.
TEST(Comparison, NoiseFloorVerdicts) {
  std::vector<Metric> metrics = {make_metric("step_time_s", 1.0, 1.3), make_metric("device_peak_bytes.rank0", 100, 100)};
  metrics[1].tolerance = 0.03;
  EXPECT_EQ(verdict_for(metrics, 0.1), "fail");
  NoiseFloor wide{1.0, 1.4, 0.0, 2, 0.25};
  EXPECT_EQ(verdict_for(metrics, 0.1, &wide), "within noise");
  NoiseFloor tight{1.25, 1.35, 0.1, 2, 0.25};
  EXPECT_EQ(verdict_for(metrics, 0.1, &tight), "fail");
  NoiseFloor busy{1.25, 1.35, 1.2, 2, 0.25};
  EXPECT_EQ(verdict_for(metrics, 0.1, &busy), "not judged: machine busy (other programs used 1.20 of 2 cores)");
  metrics[1] = make_metric("device_peak_bytes.rank0", 110, 100);
  metrics[1].tolerance = 0.03;
  EXPECT_EQ(verdict_for(metrics, 0.1, &busy), "fail");  // memory does not depend on the load
  metrics[1] = make_metric("device_peak_bytes.rank0", 100, 100);
  metrics[0] = make_metric("step_time_s", 1.05, 1.0);
  EXPECT_EQ(verdict_for(metrics, 0.1, &busy), "pass");  // a step within tolerance passes whatever the load

  Comparison c = sample_comparison();
  c.metrics[0] = make_metric(c.metrics[0].name, c.metrics[0].measured * 0.7, c.metrics[0].measured);
  c.noise = NoiseFloor{c.metrics[0].measured * 0.6, c.metrics[0].measured * 1.2, 1.5, 2, 0.25};
  c.verdict = verdict_for(c.metrics, c.tolerance, &*c.noise);
  EXPECT_EQ(c.verdict, "not judged: machine busy (other programs used 1.50 of 2 cores)");
  testing::expect_round_trip(c);
  c.verdict = "fail";
  testing::expect_error_containing([&] { validate(c); }, "give \"not judged: machine busy");
}

TEST(Comparison, StrictKeys) {
  nlohmann::json j = sample_comparison();
  j["metrics"][0]["rel_err"] = 0;
  expect_error([&] { j.get<Comparison>(); },
               "comparison.metrics[0]: unknown key \"rel_err\" (did you mean \"rel_error\"?)");
}

class ComparisonRule : public ::testing::TestWithParam<testing::Rule<Comparison>> {};

TEST_P(ComparisonRule, MessageIsExact) {
  Comparison c = sample_comparison();
  GetParam().mutate(c);
  expect_error([&] { validate(c); }, GetParam().message);
  const nlohmann::json j = c;
  expect_error([&] { j.get<Comparison>(); }, GetParam().message);
}

const testing::Rule<Comparison> kComparisonRules[] = {
    {"Tolerance", [](Comparison& c) { c.tolerance = 0; }, "comparison: tolerance must be > 0 (got 0.0)"},
    {"MetricName", [](Comparison& c) { c.metrics[1].name.clear(); }, "comparison: metrics[1].name is empty"},
    {"MetricUnique", [](Comparison& c) { c.metrics[1].name = "step_time_s"; },
     "comparison: metrics[1].name \"step_time_s\" is not unique"},
    {"RelError", [](Comparison& c) { c.metrics[0].rel_error = 0.5; },
     "comparison: metrics[0] (step_time_s).rel_error 0.5 != (predicted 0.21 - measured 0.2) / measured (= "
     "0.049999999999999906)"},
    {"UnitRelError", [](Comparison& c) { c.units[0].metrics[0].rel_error = 0; },
     "comparison: units[0].metrics[0] (fwd_s).rel_error 0.0 != (predicted 0.001 - measured 0.0012) / measured (= "
     "-0.16666666666666657)"},
    {"Verdict", [](Comparison& c) { c.verdict = "ok"; },
     "comparison: verdict \"ok\" but the gating metrics at tolerance 0.2 give \"pass\""},
    {"VerdictConsistent", [](Comparison& c) { c.verdict = "fail"; },
     "comparison: verdict \"fail\" but the gating metrics at tolerance 0.2 give \"pass\""},
};

INSTANTIATE_TEST_SUITE_P(Rules, ComparisonRule, ::testing::ValuesIn(kComparisonRules),
                         [](const ::testing::TestParamInfo<testing::Rule<Comparison>>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zeroplan
