#include "zeroplan/profiles/run_record.h"

#include <cmath>

#include "schema_test_util.h"

namespace zeroplan {
namespace {

using testing::expect_error;
using testing::expect_error_containing;
using testing::sample_run_record;

TEST(RunRecord, RoundTripWithNanLoss) {
  const RunRecord r = sample_run_record();
  validate(r);
  testing::expect_round_trip(r);
  const std::string text = to_json_string(r);
  EXPECT_NE(text.find("null"), std::string::npos);
  EXPECT_TRUE(std::isnan(parse_document<RunRecord>(text).losses[2]));
}

// A pipelined run: per-stage peaks and the measured bubble, optional fields that round-trip.
TEST(RunRecord, RoundTripWithPipelineStages) {
  RunRecord r = sample_run_record();
  r.plan = Plan::default_ddp(2, 68);
  r.plan.pipeline_stages = 2;
  r.plan.micro_batch = 17;
  r.plan.microbatches = 4;
  r.plan.pipeline.schedule = "1f1b";
  r.plan.pipeline.balance = {PipelineBalance::Mode::units, {2, 2}};
  r.stages = {{0, 0, 2, {0}, 1000, 0, 0.05}, {1, 2, 2, {1}, 1010, 0, 0.04}};
  r.bubble_fraction = 0.25;
  validate(r);
  testing::expect_round_trip(r);
  // Without them the document has neither key (older readers see what they saw).
  const std::string text = to_json_string(sample_run_record());
  EXPECT_EQ(text.find("bubble_fraction"), std::string::npos);
  EXPECT_EQ(text.find("\"stages\""), std::string::npos);
}

// The host allocator's reserved bytes (CUDA pinned blocks): optional per rank, round-trips, never negative.
TEST(RunRecord, HostReservedBytesAreOptionalPerRank) {
  RunRecord r = sample_run_record();
  r.peaks[0].host_reserved_bytes = 1 << 20;
  validate(r);
  testing::expect_round_trip(r);
  EXPECT_NE(to_json_string(r).find("\"host_reserved_bytes\": 1048576"), std::string::npos);
  EXPECT_EQ(to_json_string(sample_run_record()).find("host_reserved_bytes"), std::string::npos);
  r.peaks[1].host_reserved_bytes = -1;
  expect_error_containing([&] { validate(r); }, "host reserved -1");
}

TEST(RunRecord, Statistics) {
  // numpy.percentile([0.21, 0.2, 0.22, 0.19, 0.2], [10, 50, 90]) = [0.194, 0.2, 0.216]
  const RunRecord r = sample_run_record();
  EXPECT_EQ(r.measured_step_times_s().size(), 5u);
  EXPECT_DOUBLE_EQ(r.step_time_median_s, 0.2);
  EXPECT_NEAR(r.step_time_p10_s, 0.194, 1e-12);
  EXPECT_NEAR(r.step_time_p90_s, 0.216, 1e-12);
  EXPECT_DOUBLE_EQ(percentile({3, 1, 2}, 50), 2);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({7}, 90), 7);
}

TEST(RunRecord, StrictKeys) {
  nlohmann::json j = sample_run_record();
  j["environment"]["torch"] = "2.15.0";
  j["environment"].erase("torch_version");
  expect_error([&] { j.get<RunRecord>(); }, "run_record.environment: unknown key \"torch\"");
  nlohmann::json k = sample_run_record();
  k["losses"][1] = "nan";
  expect_error([&] { k.get<RunRecord>(); }, "run_record.losses[1]: expected a number, got string \"nan\"");
}

class RunRecordRule : public ::testing::TestWithParam<testing::Rule<RunRecord>> {};

TEST_P(RunRecordRule, MessageIsExact) {
  RunRecord r = sample_run_record();
  GetParam().mutate(r);
  expect_error([&] { validate(r); }, GetParam().message);
  const nlohmann::json j = r;
  expect_error([&] { j.get<RunRecord>(); }, GetParam().message);
}

const testing::Rule<RunRecord> kRunRecordRules[] = {
    {"Plan", [](RunRecord& r) { r.plan.micro_batch = 3; },
     "plan: global_batch 68 != micro_batch 3 x microbatches 2 x world_size 2 (= 12)"},
    {"Model", [](RunRecord& r) { r.model.clear(); }, "run_record: model is empty"},
    {"Backend", [](RunRecord& r) { r.environment.backend = "mpi"; },
     "run_record: environment.backend must be \"gloo\", \"shm\" or \"nccl\" (got \"mpi\")"},
    {"Threads", [](RunRecord& r) { r.environment.threads_per_rank = 0; },
     "run_record: environment.threads_per_rank must be >= 1 (got 0)"},
    {"Ranks", [](RunRecord& r) { r.environment.ranks = 3; }, "run_record: environment.ranks 3 != plan.world_size 2"},
    {"Warmup", [](RunRecord& r) { r.warmup_steps = 7; }, "run_record: warmup_steps 7 leaves no measured step of 7"},
    {"WarmupNegative", [](RunRecord& r) { r.warmup_steps = -1; },
     "run_record: warmup_steps -1 leaves no measured step of 7"},
    {"StepTime", [](RunRecord& r) { r.step_times_s[3] = 0; }, "run_record: step_times_s[3] must be > 0 (got 0.0)"},
    {"Percentiles", [](RunRecord& r) { r.step_time_p90_s = 0.1; },
     "run_record: step times: p10 0.194 <= median 0.2 <= p90 0.1 does not hold"},
    {"Phase", [](RunRecord& r) { r.phase_times_s["forward"] = -1; },
     "run_record: phase_times_s.forward must be >= 0 (got -1.0)"},
    {"PeaksCount", [](RunRecord& r) { r.peaks.pop_back(); }, "run_record: peaks has 1 entries for 2 ranks"},
    {"PeaksOrder", [](RunRecord& r) { std::swap(r.peaks[0], r.peaks[1]); },
     "run_record: peaks[0].rank is 1 (expected 0)"},
    {"PeaksBytes", [](RunRecord& r) { r.peaks[1].host_peak_bytes = -1; },
     "run_record: peaks[1]: negative bytes (device 1010, host -1, host reserved 0)"},
    {"Losses", [](RunRecord& r) { r.losses.push_back(1.0); }, "run_record: losses has 8 entries for 7 steps"},
    {"TracePaths", [](RunRecord& r) { r.trace_paths.pop_back(); }, "run_record: trace_paths has 1 entries for 2 ranks"},
    {"StagesCount", [](RunRecord& r) { r.stages = {{0, 0, 1, {0}, 1, 0, 0}, {1, 1, 1, {1}, 1, 0, 0}}; },
     "run_record: stages has 2 entries for plan.pipeline_stages 1"},
    {"Bubble", [](RunRecord& r) { r.bubble_fraction = 1.5; }, "run_record: bubble_fraction must be in [0, 1] (got 1.5)"},
    {"UnitTimes", [](RunRecord& r) { r.units[0].fwd_s = -1; },
     "run_record: units[0]: negative time (fwd_s -1.0, bwd_s 0.002)"},
};

INSTANTIATE_TEST_SUITE_P(Rules, RunRecordRule, ::testing::ValuesIn(kRunRecordRules),
                         [](const ::testing::TestParamInfo<testing::Rule<RunRecord>>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zeroplan
