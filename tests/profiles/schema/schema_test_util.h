// Sample documents and helpers shared by the schema tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "zeroplan/profiles/json_io.h"

namespace zeroplan::testing {

// Runs `fn`, expects a SchemaError whose what() is exactly `message`.
inline void expect_error(const std::function<void()>& fn, const std::string& message) {
  try {
    fn();
    ADD_FAILURE() << "no SchemaError; expected: " << message;
  } catch (const SchemaError& e) {
    EXPECT_EQ(e.what(), message);
  }
}

// One validation rule of a document: how to break a valid sample, and the exact message it gives.
// survives_json is false when the JSON form cannot express the broken state.
template <class Doc>
struct Rule {
  const char* name;
  std::function<void(Doc&)> mutate;
  const char* message;
  bool survives_json = true;
};

// Expects a SchemaError whose what() contains `part`.
inline void expect_error_containing(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no SchemaError; expected one containing: " << part;
  } catch (const SchemaError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

inline std::string read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_file(const std::filesystem::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary);
  out << text;
}

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("zeroplan_schema_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Object -> JSON -> object equal, and JSON -> object -> JSON equal; text round trip too.
template <class T>
void expect_round_trip(const T& document) {
  const nlohmann::json j = document;
  const T back = j.get<T>();
  EXPECT_TRUE(back == document);
  EXPECT_EQ(nlohmann::json(back), j);
  const std::string text = to_json_string(document);
  EXPECT_EQ(to_json_string(parse_document<T>(text)), text);
}

inline Plan sample_plan() {
  Plan p = Plan::default_ddp(2, 68);
  p.micro_batch = 17;
  p.microbatches = 2;
  p.zero_stage = 3;
  p.reshard_after_forward = true;
  p.offload = Offload{true, true, true, 0.25};
  p.checkpointing = Checkpointing{Checkpointing::Mode::units, {0, 2}};
  p.precision.param_dtype = "bf16";
  p.precision.compute_dtype = "bf16";
  p.precision.loss_scale = LossScale{LossScale::Mode::fixed, 1024.5};
  p.precision.fp32_reduce_scatter = true;
  p.buckets.prefetch = false;
  p.flat_params = true;
  p.optimizer.lr = 0.1 + 0.2;  // a double that needs all 17 digits
  p.optimizer.weight_decay = 1e-2;
  p.seed = 18446744073709551615ULL;
  return p;
}

inline Figure sample_figure(double v) { return Figure{v, Fit{v / 3, v / 7, 0.99, 4}, {}}; }

inline ModelProfile sample_model() {
  ModelProfile m;
  m.name = "gpt2-tiny";
  m.source = "zoo:gpt/gpt2-tiny";
  m.measured = true;
  m.device = "cpu";
  m.dtype = "fp32";
  m.threads = 4;
  m.library_versions = {{"torch", "2.15.0"}, {"zeroplan", "0.1.0"}};
  m.batch = 8;
  m.seq_len = 128;
  m.input_shape = {8, 128};
  m.profiled_batches = {1, 2, 4, 8};
  UnitProfile embed;
  embed.name = "embed";
  embed.type = "Embedding";
  embed.params = 1000;
  embed.bytes_param = 4000;
  embed.input_shape = {8, 128};
  embed.output_shape = {8, 128, 64};
  embed.bytes_saved = sample_figure(1.0e5);
  embed.bytes_output = Figure::proportional(262144, 8);
  embed.time_fwd_s = sample_figure(1.1e-4);
  embed.time_bwd_s = sample_figure(2.3e-4);
  embed.time_fwd_spread_s = Figure::constant(1e-6);
  embed.time_bwd_spread_s = Figure::constant(2e-6);
  embed.bytes_peak_fwd = sample_figure(5.0e4);
  embed.bytes_peak_bwd = sample_figure(6.0e4);
  embed.flops_fwd = Figure::constant(0);
  embed.flops_bwd = Figure::constant(0);
  UnitProfile block = embed;
  block.name = "block";
  block.type = "TransformerBlock";
  block.count = 4;
  block.params = 50000;
  block.bytes_param = 200000;
  block.input_shape = block.output_shape = {8, 128, 64};
  block.flops_fwd = Figure::proportional(3.0e9, 8);
  block.flops_bwd = Figure::proportional(6.0e9, 8);
  // Its kernels (round-tripped: one op of each kind).
  UnitOp gemm;
  gemm.kind = "gemm";
  gemm.name = "fc1";
  gemm.m = 1024;
  gemm.n = 256;
  gemm.k = 64;
  gemm.bias = true;
  UnitOp attention;
  attention.kind = "attention";
  attention.name = "attention";
  attention.m = attention.n = 128;
  attention.k = 16;
  attention.batch = 32;
  attention.fused = true;
  attention.causal = true;
  UnitOp memory;
  memory.kind = "memory";
  memory.name = "gelu";
  memory.elems_fwd = 524288;
  memory.elems_bwd = 786432;
  memory.bytes_fwd = 10;
  memory.kernels_fwd = 1;
  memory.kernels_bwd = 2;
  block.ops = {gemm, attention, memory};
  UnitProfile head = embed;
  head.name = "head";
  head.type = "Head";
  head.params = 2000;
  head.bytes_param = 8000;
  head.bytes_buffer = 16;
  head.borrowed = {{0, 800}};  // a tied embedding: round-tripped with the rest
  m.units = {embed, block, head};
  return m;
}

inline Prediction sample_prediction() {
  Prediction p;
  p.model = "gpt2-tiny";
  p.cluster = "a100-sxm-80gb:2";
  p.plan = sample_plan();
  p.step_time_s = 0.123456789;
  p.sync_step_time_s = 0.123456789;
  p.samples_per_s = p.plan.global_batch / p.step_time_s;
  p.lower_bound_s = 0.1;
  p.device = PoolPeak{1000, 50, 80LL << 30, 0.05,
                      {{"params", "block[0].params", 600}, {"activations", "block[1].saved", 400}}};
  p.host = PoolPeak{2000, 0, 1LL << 40, 0.07, {{"optimizer", "adam states", 2000}}};
  p.resource_busy_s = {{"compute", 0.1}, {"h2d", 0.02}, {"comm.intra", 0.03}};
  p.exposed_comm_s = 0.01;
  p.overlapped_comm_s = 0.02;
  p.bound = "compute";
  p.units = {{"embed", 0, 0.001, 0.1, 0.002}, {"block[0]", 0.001, 0.01, 0.08, 0.02}};
  p.trace_path = "out/predicted.trace.json";
  p.notes = {"host optimizer rate is an estimate"};
  return p;
}

inline RunRecord sample_run_record() {
  RunRecord r;
  r.model = "gpt2-tiny";
  r.plan = sample_plan();
  r.environment = RunEnvironment{"node0", "gloo", "cpu", 4, "2.15.0", "0.1.0", 2};
  r.warmup_steps = 2;
  r.step_times_s = {0.5, 0.3, 0.21, 0.2, 0.22, 0.19, 0.2};
  r.compute_step_statistics();
  r.phase_times_s = {{"forward", 0.05}, {"backward", 0.1}, {"optimizer", 0.04}};
  r.peaks = {{0, 1000, 200, "backward head (step 2, microbatch 0)"}, {1, 1010, 210, ""}};
  r.losses = {2.5, 2.4, std::nan(""), 2.2, 2.1, 2.05, 2.0};
  r.units = {{"embed", 0.001, 0.002}};
  r.fallbacks = {"gloo reduce_scatter via all_reduce"};
  r.trace_paths = {"out/rank0.trace.json", "out/rank1.trace.json"};
  return r;
}

inline Comparison sample_comparison() {
  Comparison c;
  c.predicted = "out/prediction.json";
  c.measured = "out/run.json";
  c.tolerance = 0.2;
  c.metrics = {make_metric("step_time_s", 0.21, 0.2), make_metric("device_peak_bytes", 1000, 1010),
               make_metric("phase.optimizer_s", 0.01, 0.04, false)};
  c.units = {{"embed", {make_metric("fwd_s", 0.001, 0.0012, false)}}};
  c.verdict = verdict_for(c.metrics, c.tolerance);
  c.largest_error_sources = {"phase.optimizer_s: -75%"};
  c.warnings = {"1 of 7 steps had a NaN loss"};
  return c;
}

}  // namespace zeroplan::testing
