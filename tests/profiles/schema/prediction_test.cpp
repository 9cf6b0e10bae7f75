#include "zeroplan/profiles/prediction.h"

#include "schema_test_util.h"

namespace zeroplan {
namespace {

using testing::expect_error;
using testing::sample_prediction;

TEST(Prediction, RoundTrip) {
  validate(sample_prediction());
  testing::expect_round_trip(sample_prediction());
}

TEST(Prediction, Fits) {
  Prediction p = sample_prediction();
  EXPECT_TRUE(p.fits());
  EXPECT_EQ(p.device.total_bytes(), 1050);
  p.device.capacity_bytes = 1049;
  EXPECT_FALSE(p.fits());
}

TEST(Prediction, SyncStepDefaultsToStep) {
  nlohmann::json j = sample_prediction();
  j.erase("sync_step_time_s");
  EXPECT_EQ(j.get<Prediction>().sync_step_time_s, sample_prediction().step_time_s);
}

TEST(Prediction, NestedPlanIsStrict) {
  nlohmann::json j = sample_prediction();
  j["plan"]["zero_stge"] = 1;
  expect_error([&] { j.get<Prediction>(); }, "prediction.plan: unknown key \"zero_stge\" (did you mean \"zero_stage\"?)");
  nlohmann::json k = sample_prediction();
  k["device"]["resident"][0]["categry"] = "params";
  expect_error([&] { k.get<Prediction>(); },
               "prediction.device.resident[0]: unknown key \"categry\" (did you mean \"category\"?)");
}

class PredictionRule : public ::testing::TestWithParam<testing::Rule<Prediction>> {};

TEST_P(PredictionRule, MessageIsExact) {
  Prediction p = sample_prediction();
  GetParam().mutate(p);
  expect_error([&] { validate(p); }, GetParam().message);
  const nlohmann::json j = p;
  expect_error([&] { j.get<Prediction>(); }, GetParam().message);
}

const testing::Rule<Prediction> kPredictionRules[] = {
    {"Plan", [](Prediction& p) { p.plan.zero_stage = 5; }, "plan: zero_stage must be 0, 1, 2 or 3 (got 5)"},
    {"Model", [](Prediction& p) { p.model.clear(); }, "prediction: model is empty"},
    {"Cluster", [](Prediction& p) { p.cluster.clear(); }, "prediction: cluster is empty"},
    {"StepTime", [](Prediction& p) { p.step_time_s = 0; }, "prediction: step_time_s must be > 0 (got 0.0)"},
    {"SyncStep", [](Prediction& p) { p.sync_step_time_s = -1; }, "prediction: sync_step_time_s must be >= 0 (got -1.0)"},
    {"LowerBoundNegative", [](Prediction& p) { p.lower_bound_s = -1; },
     "prediction: lower_bound_s must be >= 0 (got -1.0)"},
    {"LowerBound", [](Prediction& p) { p.lower_bound_s = 0.2; },
     "prediction: lower_bound_s 0.2 > step_time_s 0.123456789"},
    {"SamplesPerS", [](Prediction& p) { p.samples_per_s = 500; },
     "prediction: samples_per_s 500.0 != global_batch 68 / step_time_s 0.123456789 (= 550.80000501228)"},
    {"Bound", [](Prediction& p) { p.bound = "memory"; },
     "prediction: bound must be one of \"compute\", \"communication\", \"copies\", \"host_optimizer\" (got \"memory\")"},
    {"Exposed", [](Prediction& p) { p.exposed_comm_s = -0.5; }, "prediction: exposed_comm_s must be >= 0 (got -0.5)"},
    {"Overlapped", [](Prediction& p) { p.overlapped_comm_s = -0.5; },
     "prediction: overlapped_comm_s must be >= 0 (got -0.5)"},
    {"PeakBytes", [](Prediction& p) { p.device.peak_bytes = -1; }, "prediction: device.peak_bytes must be >= 0 (got -1)"},
    {"Overhead", [](Prediction& p) { p.host.allocator_overhead_bytes = -1; },
     "prediction: host.allocator_overhead_bytes must be >= 0 (got -1)"},
    {"Capacity", [](Prediction& p) { p.device.capacity_bytes = -1; },
     "prediction: device.capacity_bytes must be >= 0 (got -1)"},
    {"PeakTime", [](Prediction& p) { p.device.at_s = -1; }, "prediction: device.at_s must be >= 0 (got -1.0)"},
    {"Category", [](Prediction& p) { p.device.resident[1].category = "weights"; },
     "prediction: device.resident[1].category must be one of \"params\", \"grads\", \"optimizer\", \"activations\", "
     "\"buffers\", \"overhead\" (got \"weights\")"},
    {"ResidentBytes", [](Prediction& p) { p.host.resident[0].bytes = -2; },
     "prediction: host.resident[0].bytes must be >= 0 (got -2)"},
    {"ResidentSum", [](Prediction& p) { p.device.resident[0].bytes = 700; },
     "prediction: device: resident bytes sum to 1100 > peak_bytes 1000"},
    {"ResourceBusy", [](Prediction& p) { p.resource_busy_s["h2d"] = -1; },
     "prediction: resource_busy_s.h2d must be >= 0 (got -1.0)"},
    {"UnitTime", [](Prediction& p) { p.units[1].bwd_s = -1; }, "prediction: units[1].bwd_s must be >= 0 (got -1.0)"},
};

INSTANTIATE_TEST_SUITE_P(Rules, PredictionRule, ::testing::ValuesIn(kPredictionRules),
                         [](const ::testing::TestParamInfo<testing::Rule<Prediction>>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zeroplan
