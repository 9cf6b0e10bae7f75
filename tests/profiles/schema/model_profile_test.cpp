#include "zeroplan/profiles/model_profile.h"

#include "schema_test_util.h"

namespace zeroplan {
namespace {

using testing::expect_error;
using testing::sample_model;

TEST(ModelProfile, RoundTrip) {
  validate(sample_model());
  testing::expect_round_trip(sample_model());
}

// The backward's timeline (saved tensors, the order first unpacked, the peaks between): written when
// recorded, absent otherwise.
TEST(ModelProfile, BackwardTimelineRoundTripsWhenRecorded) {
  ModelProfile m = sample_model();
  EXPECT_FALSE(nlohmann::json(m)["units"][1].contains("bwd_unpack_order"));
  m.units[1].saved_tensors = {64, 32};
  m.units[1].bwd_unpack_order = {1, 0};
  m.units[1].bwd_unpack_peaks = {0, 96, -32};
  m.units[1].bwd_unpack_peaks_in_place = {0, 64, -32};
  validate(m);
  testing::expect_round_trip(m);
}

TEST(ModelProfile, Totals) {
  const ModelProfile m = sample_model();
  EXPECT_EQ(m.total_params(), 1000 + 4 * 50000 + 2000);
  EXPECT_EQ(m.total_bytes_param(), 4000 + 4 * 200000 + 8000);
  EXPECT_EQ(m.expanded_unit_count(), 6);
  // At the reference batch the measured values; elsewhere the fit.
  const double at_ref = 6 * (1.1e-4 + 2.3e-4);
  EXPECT_DOUBLE_EQ(m.total_compute_time_s(8), at_ref);
  const double fwd2 = 1.1e-4 / 3 + 1.1e-4 / 7 * 2, bwd2 = 2.3e-4 / 3 + 2.3e-4 / 7 * 2;
  EXPECT_DOUBLE_EQ(m.total_compute_time_s(2), 6 * (fwd2 + bwd2));
}

TEST(ModelProfile, Figures) {
  EXPECT_DOUBLE_EQ(Figure::constant(5).at(100, 8), 5);
  EXPECT_DOUBLE_EQ(Figure::proportional(80, 8).at(2, 8), 20);
  EXPECT_DOUBLE_EQ(Figure::proportional(80, 8).at(8, 8), 80);
  const Figure f{10, Fit{1, 1, 0.9, 3}, {}};
  EXPECT_DOUBLE_EQ(f.at(8, 8), 10);  // measured value wins at the reference batch
  EXPECT_DOUBLE_EQ(f.at(4, 8), 5);
}

// What was measured at each profiled batch answers those batches exactly and is interpolated between
// them (a backward peak that jumps at batch 4, as oneDNN's scratchpad does on resnet-tiny's layer4, is
// not a line); outside them the fit.
TEST(ModelProfile, FigureMeasuredBatchesExactAndInterpolated) {
  const Figure f{1'041'664, Fit{527'872, 147'090, 0.56, 3}, {{1, 525'000}, {2, 528'000}, {4, 1'041'664}}};
  EXPECT_DOUBLE_EQ(f.at(4, 4), 1'041'664);
  EXPECT_DOUBLE_EQ(f.at(1, 4), 525'000);  // the line says 674,962
  EXPECT_DOUBLE_EQ(f.at(2, 4), 528'000);
  EXPECT_DOUBLE_EQ(f.at(3, 4), (528'000 + 1'041'664) / 2.0);
  EXPECT_DOUBLE_EQ(f.at(8, 4), 527'872 + 8 * 147'090.0);
  EXPECT_DOUBLE_EQ(f.at(0.5, 4), 527'872 + 0.5 * 147'090.0);

  nlohmann::json j = sample_model();
  j["units"][0]["bytes_peak_bwd"]["measured"] = {{1, 10.0}, {2, 30.0}};
  const ModelProfile m = j.get<ModelProfile>();
  EXPECT_EQ(m.units[0].bytes_peak_bwd.measured.size(), 2u);
  EXPECT_EQ(nlohmann::json(m).get<ModelProfile>(), m);  // round trip
  j["units"][0]["bytes_peak_bwd"]["measured"] = {{2, 10.0}, {1, 30.0}};
  testing::expect_error_containing([&] { j.get<ModelProfile>(); }, "measured batches must increase (got 2");
  j["units"][0]["bytes_peak_bwd"]["measured"] = {{1, 10.0, 3.0}};
  testing::expect_error_containing([&] { j.get<ModelProfile>(); }, "expected an array of 2");
}

TEST(ModelProfile, FigureWithoutFitIsConstant) {
  nlohmann::json j = sample_model();
  j["units"][0]["time_fwd_s"] = {{"value", 0.5}};
  const ModelProfile m = j.get<ModelProfile>();
  EXPECT_EQ(m.units[0].time_fwd_s, Figure::constant(0.5));
}

TEST(ModelProfile, OptionalKeysDefault) {
  nlohmann::json j = sample_model();
  for (const char* key : {"library_versions", "seq_len", "image_size", "profiled_batches"}) j.erase(key);
  for (const char* key : {"count", "bytes_buffer", "time_fwd_spread_s", "time_bwd_spread_s"}) j["units"][0].erase(key);
  const ModelProfile m = j.get<ModelProfile>();
  EXPECT_TRUE(m.library_versions.empty());
  EXPECT_EQ(m.seq_len, 0);
  EXPECT_EQ(m.units[0].count, 1);
  EXPECT_EQ(m.units[0].time_fwd_spread_s, Figure{});
}

// CUPTI kernel times: written only when measured (> 0), read back as written, absent = 0.
TEST(ModelProfile, KernelTimesRoundTripWhenMeasured) {
  ModelProfile m = sample_model();
  const nlohmann::json without = m;
  for (const auto& u : without["units"]) {
    EXPECT_FALSE(u.contains("kernel_time_fwd_s"));
    EXPECT_FALSE(u.contains("kernel_time_bwd_s"));
  }
  m.units[1].kernel_time_fwd_s = Figure{9e-5, Fit{1e-5, 1e-5, 0.99, 2}, {}};
  m.units[1].kernel_time_bwd_s = Figure{2e-4, Fit{2e-5, 2.25e-5, 1, 2}, {}};
  validate(m);
  testing::expect_round_trip(m);
  const nlohmann::json j = m;
  EXPECT_EQ(j["units"][1]["kernel_time_fwd_s"]["value"].get<double>(), 9e-5);
  EXPECT_EQ(j["units"][1]["kernel_time_bwd_s"]["points"].get<int>(), 2);
  EXPECT_FALSE(j["units"][0].contains("kernel_time_fwd_s"));
  const ModelProfile back = j.get<ModelProfile>();
  EXPECT_EQ(back.units[1].kernel_time_fwd_s, m.units[1].kernel_time_fwd_s);
  EXPECT_EQ(back.units[1].kernel_time_bwd_s, m.units[1].kernel_time_bwd_s);
  EXPECT_EQ(back.units[0].kernel_time_fwd_s, Figure{});
  m.units[1].kernel_time_bwd_s.value = -1;
  expect_error([&] { validate(m); }, "model_profile: units[1] (block).kernel_time_bwd_s must be >= 0 (got -1.0)");
}

TEST(ModelProfile, OpsAreOptionalAndWrittenOnlyWithTheirKindsKeys) {
  // A profile without ops (every file written before them) reads as before and writes no "ops".
  ModelProfile m = sample_model();
  for (UnitProfile& u : m.units) u.ops.clear();
  const nlohmann::json j = m;
  for (const auto& u : j["units"]) EXPECT_FALSE(u.contains("ops"));
  EXPECT_EQ(j.get<ModelProfile>(), m);
  // A gemm writes its sizes and bias, a memory op its elements, bytes and kernels.
  const nlohmann::json s = sample_model();
  const auto& ops = s["units"][1]["ops"];
  EXPECT_EQ(ops[0].dump(), R"({"batch":1,"bias":true,"k":64,"kind":"gemm","m":1024,"n":256,"name":"fc1"})");
  EXPECT_FALSE(ops[2].contains("m"));
  EXPECT_EQ(ops[2]["kernels_bwd"], 2);
  EXPECT_TRUE(ops[1]["fused"].get<bool>());
}

// How the times were taken (concurrent_ranks, backward_adds_grads) and the times at other dtypes: absent in
// older profiles and read as 1 / false / none; written only when not the default.
TEST(ModelProfile, RunConditionsAndDtypeTimesAreOptional) {
  ModelProfile m = sample_model();
  nlohmann::json j = m;
  EXPECT_FALSE(j.contains("concurrent_ranks"));
  EXPECT_FALSE(j.contains("backward_adds_grads"));
  EXPECT_FALSE(j.contains("device_library_bytes"));
  EXPECT_FALSE(j["units"][1].contains("times_at_dtype"));
  EXPECT_EQ(j.get<ModelProfile>().concurrent_ranks, 1);
  m.concurrent_ranks = 2;
  m.backward_adds_grads = true;
  m.device_library_bytes = 34603008;
  m.units[1].times_at_dtype["bf16"] = DtypeTimes{Figure::constant(6e-5), Figure{1.5e-4, Fit{1e-5, 1.75e-5, 1, 2}, {}}};
  validate(m);
  testing::expect_round_trip(m);
  j = m;
  EXPECT_EQ(j["concurrent_ranks"].get<int>(), 2);
  EXPECT_EQ(j["device_library_bytes"].get<std::int64_t>(), 34603008);
  EXPECT_EQ(j["units"][1]["times_at_dtype"]["bf16"]["time_bwd_s"]["value"].get<double>(), 1.5e-4);
  m.units[1].times_at_dtype["int8"] = DtypeTimes{};
  expect_error([&] { validate(m); }, "model_profile: units[1] (block).times_at_dtype: \"int8\" is not one of fp32, fp16, bf16");
  m.units[1].times_at_dtype.erase("int8");
  m.concurrent_ranks = 0;
  expect_error([&] { validate(m); }, "model_profile: concurrent_ranks must be in 1..4096 (got 0)");
  m.concurrent_ranks = 1;
  m.device_library_bytes = -1;
  expect_error([&] { validate(m); }, "model_profile: device_library_bytes must be >= 0 (got -1)");
}

// The same model profiled at another dtype: its unit times go into the profile's times_at_dtype.
TEST(ModelProfile, AddTimesAtDtype) {
  ModelProfile m = sample_model();
  ModelProfile b = sample_model();
  b.dtype = "bf16";
  for (UnitProfile& u : b.units) u.time_fwd_s = Figure::constant(u.time_fwd_s.value / 2);
  add_times_at_dtype(m, b);
  for (std::size_t i = 0; i < m.units.size(); ++i) {
    EXPECT_EQ(m.units[i].times_at_dtype.at("bf16").time_fwd_s, b.units[i].time_fwd_s);
    EXPECT_EQ(m.units[i].times_at_dtype.at("bf16").time_bwd_s, b.units[i].time_bwd_s);
  }
  validate(m);
  expect_error([&] { add_times_at_dtype(m, m); }, "model_profile: times at " + m.dtype + ": the profile is already at " + m.dtype);
  b.units.pop_back();
  expect_error([&] { add_times_at_dtype(m, b); }, "model_profile: times at bf16: 2 units, the profile has 3");
  b = sample_model();
  b.dtype = "bf16";
  b.concurrent_ranks = 2;
  EXPECT_THROW(add_times_at_dtype(m, b), SchemaError);
}

TEST(ModelProfile, StrictKeys) {
  nlohmann::json j = sample_model();
  j["units"][1]["time_fwd"] = j["units"][1]["time_fwd_s"];
  j["units"][1].erase("time_fwd_s");
  expect_error([&] { j.get<ModelProfile>(); },
               "model_profile.units[1]: unknown key \"time_fwd\" (did you mean \"time_fwd_s\"?)");
  nlohmann::json k = sample_model();
  k["units"][0]["bytes_saved"]["slope"] = 1;
  expect_error([&] { k.get<ModelProfile>(); },
               "model_profile.units[0].bytes_saved: unknown key \"slope\"");
  nlohmann::json m = sample_model();
  m["units"][2].erase("params");
  m["units"][2].erase("flops_bwd");
  expect_error([&] { m.get<ModelProfile>(); }, "model_profile.units[2]: missing required keys \"params\", \"flops_bwd\"");
  nlohmann::json s = sample_model();
  s["schema"] = "zeroplan.model_profile/2";
  expect_error([&] { s.get<ModelProfile>(); },
               "model_profile: schema is string \"zeroplan.model_profile/2\", expected \"zeroplan.model_profile/1\"");
}

class ModelRule : public ::testing::TestWithParam<testing::Rule<ModelProfile>> {};

TEST_P(ModelRule, MessageIsExact) {
  ModelProfile m = sample_model();
  GetParam().mutate(m);
  expect_error([&] { validate(m); }, GetParam().message);
  const nlohmann::json j = m;
  expect_error([&] { j.get<ModelProfile>(); }, GetParam().message);
}

const testing::Rule<ModelProfile> kModelProfileRules[] = {
    {"Name", [](ModelProfile& m) { m.name.clear(); }, "model_profile: name is empty"},
    {"Source", [](ModelProfile& m) { m.source.clear(); }, "model_profile: source is empty"},
    {"Dtype", [](ModelProfile& m) { m.dtype = "int8"; },
     "model_profile: dtype must be \"fp32\", \"fp16\" or \"bf16\" (got \"int8\")"},
    {"Threads", [](ModelProfile& m) { m.threads = 0; }, "model_profile: threads must be >= 1 (got 0)"},
    {"Batch", [](ModelProfile& m) { m.batch = 0; }, "model_profile: batch must be >= 1 (got 0)"},
    {"SeqLen", [](ModelProfile& m) { m.seq_len = -1; }, "model_profile: seq_len must be >= 0 (got -1)"},
    {"ImageSize", [](ModelProfile& m) { m.image_size = -3; }, "model_profile: image_size must be >= 0 (got -3)"},
    {"ProfiledBatchPositive", [](ModelProfile& m) { m.profiled_batches = {0, 2}; },
     "model_profile: profiled_batches[0] must be >= 1 (got 0)"},
    {"ProfiledBatchOrder", [](ModelProfile& m) { m.profiled_batches = {1, 4, 2}; },
     "model_profile: profiled_batches must be increasing (4 then 2)"},
    {"NoUnits", [](ModelProfile& m) { m.units.clear(); }, "model_profile: no units"},
    {"UnitName", [](ModelProfile& m) { m.units[1].name.clear(); }, "model_profile: units[1].name is empty"},
    {"UnitNameUnique", [](ModelProfile& m) { m.units[2].name = "embed"; },
     "model_profile: units[2].name \"embed\" is not unique"},
    {"UnitType", [](ModelProfile& m) { m.units[1].type.clear(); }, "model_profile: units[1] (block).type is empty"},
    {"UnitCount", [](ModelProfile& m) { m.units[1].count = 0; },
     "model_profile: units[1] (block).count must be >= 1 (got 0)"},
    {"UnitCountHuge", [](ModelProfile& m) { m.units[1].count = 2147483647; },
     "model_profile: units[1] (block).count must be at most 1000000 (got 2147483647)"},
    {"UnitsInAllHuge", [](ModelProfile& m) { m.units[0].count = m.units[1].count = 600000; },
     "model_profile: units[1] (block): more than 1000000 units in all (with the counts so far: 1200000)"},
    {"FigureHuge", [](ModelProfile& m) { m.units[0].time_fwd_s.value = 1e308; },
     "model_profile: units[0] (embed).time_fwd_s must be finite and at most 1e18 in size (got 1e+308)"},
    {"FigureFitHuge", [](ModelProfile& m) { m.units[0].bytes_saved.fit.per_sample = -1e300; },
     "model_profile: units[0] (embed).bytes_saved must be finite and at most 1e18 in size (got -1e+300)"},
    {"UnitParams", [](ModelProfile& m) { m.units[1].params = -5; },
     "model_profile: units[1] (block).params must be >= 0 (got -5)"},
    {"UnitBytesParam", [](ModelProfile& m) { m.units[1].bytes_param = -5; },
     "model_profile: units[1] (block).bytes_param must be >= 0 (got -5)"},
    {"UnitBytesParamZero", [](ModelProfile& m) { m.units[1].bytes_param = 0; },
     "model_profile: units[1] (block).bytes_param is 0 but params is 50000"},
    {"UnitBytesBuffer", [](ModelProfile& m) { m.units[2].bytes_buffer = -1; },
     "model_profile: units[2] (head).bytes_buffer must be >= 0 (got -1)"},
    {"FigureNegative", [](ModelProfile& m) { m.units[0].time_bwd_s.value = -1e-3; },
     "model_profile: units[0] (embed).time_bwd_s must be >= 0 (got -0.001)"},
    {"FigurePoints", [](ModelProfile& m) { m.units[0].flops_fwd.fit.points = -1; },
     "model_profile: units[0] (embed).flops_fwd.points must be >= 0 (got -1)"},
    {"FigureR2", [](ModelProfile& m) { m.units[0].bytes_saved.fit.r2 = 1.5; },
     "model_profile: units[0] (embed).bytes_saved.r2 must be <= 1 (got 1.5)"},
    {"UnpackOrder",
     [](ModelProfile& m) {
       m.units[1].saved_tensors = {64};
       m.units[1].bwd_unpack_order = {1};
     },
     "model_profile: units[1] (block).bwd_unpack_order[0] must name one of the 1 saved_tensors (got 1)"},
    {"UnpackPeaks",
     [](ModelProfile& m) {
       m.units[1].saved_tensors = {64};
       m.units[1].bwd_unpack_order = {0};
       m.units[1].bwd_unpack_peaks_in_place = {5, 6, 7};
     },
     "model_profile: units[1] (block).bwd_unpack_peaks_in_place must have one more entry than bwd_unpack_order's 1 (got 3)"},
    {"OpKind", [](ModelProfile& m) { m.units[1].ops[0].kind = "conv"; },
     "model_profile: units[1] (block).ops[0].kind must be \"gemm\", \"attention\" or \"memory\" (got \"conv\")"},
    {"OpGemmDims", [](ModelProfile& m) { m.units[1].ops[0].k = 0; },
     "model_profile: units[1] (block).ops[0] (fc1): m, n, k and batch must be >= 1 (got 1024, 256, 0, 1)"},
    {"OpAttentionBatch", [](ModelProfile& m) { m.units[1].ops[1].batch = 0; },
     "model_profile: units[1] (block).ops[1] (attention): m, n, k and batch must be >= 1 (got 128, 128, 16, 0)"},
    {"OpMemoryElems", [](ModelProfile& m) { m.units[1].ops[2].elems_bwd = -1; },
     "model_profile: units[1] (block).ops[2] (gelu): elems and bytes must be finite and >= 0 (got 524288.0, -1.0, 10.0, 0.0)"},
    {"OpMemoryKernels", [](ModelProfile& m) { m.units[1].ops[2].kernels_fwd = -1; },
     "model_profile: units[1] (block).ops[2] (gelu): kernels must be >= 0 (got -1, 2)"},
    {"BorrowedLaterUnit", [](ModelProfile& m) { m.units[2].borrowed[0].unit = 2; },
     "model_profile: units[2] (head).borrowed[0].unit 2 is not an earlier unit (0..1)"},
    {"BorrowedRepeatedOwner", [](ModelProfile& m) { m.units[2].borrowed[0].unit = 1; },
     "model_profile: units[2] (head).borrowed[0].unit 1 (block) has count 4; an owner must have count 1"},
    {"BorrowedTooMany", [](ModelProfile& m) { m.units[2].borrowed[0].params = 1001; },
     "model_profile: units[2] (head).borrowed[0].params 1001 is not in 1..1000 (the parameters of embed)"},
};

INSTANTIATE_TEST_SUITE_P(Rules, ModelRule, ::testing::ValuesIn(kModelProfileRules),
                         [](const ::testing::TestParamInfo<testing::Rule<ModelProfile>>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zeroplan
