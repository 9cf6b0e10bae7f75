// Calibration of the time model (sim/include/zeroplan/sim/calibrate.h): the public table's rows, the
// shipped fit recomputed from them, and a fit that recovers known terms.
#include "zeroplan/sim/calibrate.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "zeroplan/profiles/analytic.h"
#include "zeroplan/sim/errors.h"
#include "zeroplan/sim/simulate.h"

namespace zeroplan::sim {
namespace {

nlohmann::json table() {
  std::ifstream in(shipped_data_dir() / "calibration" / "llm-foundry-mpt.json");
  EXPECT_TRUE(in) << "no profiles/data/calibration/llm-foundry-mpt.json";
  return nlohmann::json::parse(in);
}

// Every bf16 row of the table is read, and the analytic MPT of each counts exactly the row's parameters
// (benchmark_rows throws otherwise): biases, learned positions of seq rows, vocab 50368.
TEST(CalibrationRows, EveryRowCountsTheTablesParameters) {
  const nlohmann::json doc = table();
  EXPECT_EQ(doc.at("commit"), "8c8dd48f72168c5d51e2f7b151595892a8fba43d");
  std::size_t read = 0;
  for (const char* device : {"h100_80gb", "a100_80gb", "a100_40gb"}) {
    const auto rows = benchmark_rows(doc, device, cluster_for_benchmark_device(device));
    read += rows.size();
    for (const CalibrationRow& r : rows) {
      EXPECT_GT(r.measured_step_s, 0) << r.label;
      EXPECT_EQ(r.plan.global_batch, r.plan.micro_batch * r.plan.microbatches * r.plan.world_size) << r.label;
      EXPECT_EQ(r.cluster.world_size(), r.plan.world_size) << r.label;
    }
  }
  EXPECT_EQ(read, doc.at("rows").size());
  // The split alternates over model sizes: 350m, 1b, 7b, 30b held out; 125m, 760m, 3b, 13b, 70b fitted.
  for (const CalibrationRow& r : benchmark_rows(doc, "a100_80gb", "a100-sxm-80gb")) {
    const std::string size = r.label.substr(0, r.label.find(' '));
    const bool odd = size == "350m" || size == "1b" || size == "7b" || size == "30b";
    EXPECT_EQ(r.held_out, odd) << r.label;
  }
  EXPECT_THROW(benchmark_rows(doc, "tpu_v5", "a100-sxm-80gb"), SimError);
  nlohmann::json wrong = doc;
  wrong["rows"][0]["num_params"] = 1;
  EXPECT_THROW(benchmark_rows(wrong, wrong["rows"][0]["device"].get<std::string>(), "h100-sxm-80gb"), SimError);
}

// The shipped GPU files' calibration is `zeroplan calibrate --table ... --device D` over the shipped rows,
// recomputed here, and it meets the goal on the rows it never saw.
TEST(CalibrationRows, ShippedFitIsTheFitOfTheShippedRows) {
  const nlohmann::json doc = table();
  for (const char* device : {"h100_80gb", "a100_80gb", "a100_40gb"}) {
    const std::string name = cluster_for_benchmark_device(device);
    const ClusterProfile shipped = resolve_cluster(name);
    CalibrationOptions options;
    options.threads = 2;
    const CalibrationResult r = calibrate(benchmark_rows(doc, device, name), shipped.calibration, options);
    for (const std::string& t : r.terms)
      EXPECT_DOUBLE_EQ(calibration_term(r.calibration, t), calibration_term(shipped.calibration, t)) << device << " " << t;
    EXPECT_LT(r.held_out_after.median, 0.10) << device;
    EXPECT_LT(r.held_out_after.worst, 0.25) << device;
    EXPECT_LT(r.held_out_after.median, r.held_out_before.median / 2) << device;
    EXPECT_LT(r.fitted_after.median, 0.10) << device;
  }
}

// Rows "measured" by the simulator with known terms: the fit finds those terms again (to the search's
// resolution), and predicts the held-out rows within 1%.
TEST(Calibrate, RecoversKnownTerms) {
  Calibration truth;
  truth.gemm_efficiency_scale = 0.7;
  truth.attention_efficiency_scale = 0.5;
  std::vector<CalibrationRow> rows;
  int i = 0;
  for (std::int64_t seq : {512, 2048, 8192}) {
    for (std::int64_t hidden : {1024, 2048, 4096}) {
      AnalyticDecoderOptions o;
      o.family = "mpt";
      o.layers = 4;
      o.hidden = hidden;
      o.heads = hidden / 128;
      o.intermediate = 4 * hidden;
      o.vocab = 50368;
      o.seq = seq;
      o.batch = 2;
      o.flash_attention = true;
      CalibrationRow r;
      r.label = std::to_string(hidden) + "/" + std::to_string(seq);
      r.model = analytic_decoder(o);
      r.cluster = resolve_cluster("a100-sxm-80gb");
      r.cluster.calibration = truth;
      r.plan.world_size = 8;
      r.plan.micro_batch = 2;
      r.plan.global_batch = 16;
      r.plan.zero_stage = 3;
      r.plan.reshard_after_forward = true;
      r.plan.precision.param_dtype = r.plan.precision.compute_dtype = "bf16";
      r.plan.precision.master_fp32 = true;
      r.measured_step_s = simulate(r.model, r.cluster, r.plan).step_time_s;
      r.held_out = i++ % 3 == 2;
      rows.push_back(std::move(r));
    }
  }
  CalibrationOptions options;
  options.terms = {"gemm_efficiency_scale", "attention_efficiency_scale"};
  const CalibrationResult r = calibrate(rows, Calibration{}, options);
  EXPECT_NEAR(r.calibration.gemm_efficiency_scale, 0.7, 0.01);
  EXPECT_NEAR(r.calibration.attention_efficiency_scale, 0.5, 0.01);
  EXPECT_LT(r.held_out_after.worst, 0.01);
  EXPECT_GT(r.held_out_before.median, 0.2);  // uncalibrated, the same rows were far off
  // The same fit with one thread or three.
  options.threads = 3;
  EXPECT_EQ(calibrate(rows, Calibration{}, options).calibration, r.calibration);
}

TEST(Calibrate, RefusesWhatItCannotFit) {
  EXPECT_THROW(calibrate({}, Calibration{}), SimError);  // no row
  Calibration c;
  EXPECT_THROW(calibration_term(c, "speed_of_light"), SimError);
  EXPECT_EQ(&calibration_term(c, "kernel_gap_s"), &c.kernel_gap_s);
  EXPECT_EQ(default_terms({}), (std::vector<std::string>{"compute_time_scale", "comm_time_scale"}));
}

}  // namespace
}  // namespace zeroplan::sim
