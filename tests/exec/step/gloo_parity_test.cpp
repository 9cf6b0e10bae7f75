// Real ranks: 2 processes over Gloo (launch_local re-runs this binary as the ranks), several plans
// per launch. Parity of every stage and offload flag against the single-process reference, with and
// without a delay before collectives; measured device peaks; --device-memory-limit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "step_test_util.h"
#include "zeroplan/exec/launcher.h"
#include "zeroplan/exec/local_communicator.h"
#include "zeroplan/exec/rendezvous.h"
#include "zeroplan/exec/run.h"

namespace zeroplan::exec::testing {
namespace {

constexpr const char* kJobVar = "ZEROPLAN_STEP_TEST_JOB";

struct Case {
  ModelSpec model;
  PlanSpec plan;
  int steps = 10;
  int delay_us = 0;
  std::int64_t limit_bytes = 0;
  bool trace = false;
  std::function<void(Plan&)> edit = nullptr;  // changes to make_plan's plan (LocalSGD, AdaScale, ...)
  int ranks_per_node = 0;
  std::string checkpoint_dir = {}, resume_dir = {};  // RunOptions' checkpoint_dir (every 3 steps) and resume_dir
};

Plan case_plan(const Case& c) {
  Plan p = make_plan(c.model, 2, c.plan);
  if (c.edit) c.edit(p);
  return p;
}

nlohmann::json to_json(const Case& c) {
  nlohmann::json plan;
  zeroplan::to_json(plan, case_plan(c));
  return {{"model", c.model.name}, {"preset", c.model.preset}, {"options", c.model.options},
          {"plan", plan},          {"steps", c.steps},          {"delay_us", c.delay_us},
          {"limit_bytes", c.limit_bytes}, {"trace", c.trace}, {"ranks_per_node", c.ranks_per_node},
          {"checkpoint_dir", c.checkpoint_dir}, {"resume_dir", c.resume_dir}};
}

// ---- the rank side: runs every case of the job, writes <dir>/rank<r>.case<i>.json and .pt ----

int rank_main(const std::string& job_path) {
  std::ifstream in(job_path);
  nlohmann::json job = nlohmann::json::parse(in);
  RankContext ctx = rank_context_from_env();
  RendezvousOptions ro;
  ro.timeout = std::chrono::seconds(30);
  auto session = join(ctx, ro);
  at::set_num_threads(1);
  for (std::size_t i = 0; i < job.size(); ++i) {
    const auto& c = job[i];
    RunOptions opt;
    opt.model = c.at("model");
    opt.preset = c.at("preset");
    opt.model_options = c.at("options").get<zoo::Options>();
    zeroplan::from_json(c.at("plan"), opt.plan);
    opt.steps = c.at("steps");
    opt.warmup_steps = opt.steps > 1 ? 1 : 0;
    opt.device_memory_limit_bytes = c.at("limit_bytes");
    opt.keep_parameters = true;
    opt.ranks_per_node = c.at("ranks_per_node");
    opt.checkpoint_dir = c.at("checkpoint_dir");
    opt.checkpoint_every = opt.checkpoint_dir.empty() ? 0 : 3;
    opt.resume_dir = c.at("resume_dir");
    if (c.at("trace").get<bool>()) opt.trace_path = ctx.output_dir + "/trace" + std::to_string(i) + ".json";
    CountingCommunicator comm(session->comm(), std::chrono::microseconds(c.at("delay_us").get<int>()));
    nlohmann::json out;
    try {
      RunResult r = run_rank(opt, comm);
      exec::to_json(out, r);
      // The collectives this rank issued, in order: [kind, bytes].
      for (const CollectiveCall& call : comm.calls()) out["calls"].push_back({to_string(call.kind), call.bytes});
      std::vector<torch::Tensor> tensors;
      for (auto& [n, t] : r.parameters) tensors.push_back(t);
      torch::save(tensors, rank_file(ctx.output_dir, ctx.rank, ".case" + std::to_string(i) + ".pt"));
    } catch (const std::exception& e) {
      out = {{"error", e.what()}};
    }
    std::ofstream(rank_file(ctx.output_dir, ctx.rank, ".case" + std::to_string(i) + ".json")) << out.dump();
  }
  session->finish();
  return 0;
}

// Before gtest: when launched as a rank, run the job and exit.
const bool kRankMain = [] {
  if (const char* job = std::getenv(kJobVar)) {
    int code = 1;
    try {
      code = rank_main(job);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank failed: %s\n", e.what());
    }
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return false;
}();

// ---- the parent side ----

struct CaseResult {
  nlohmann::json json;  // RunResult or {"error": ...}
  std::vector<torch::Tensor> params;
  nlohmann::json trace;  // when the case asked for one
};

// Runs the cases on `ranks` Gloo ranks (2 unless told); results[rank][case].
std::vector<std::vector<CaseResult>> launch(const std::vector<Case>& cases, int ranks = 2) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("zeroplan_step_" + std::to_string(::getpid()) + "_" +
                                              std::to_string(std::rand()));
  fs::create_directories(dir);
  nlohmann::json job = nlohmann::json::array();
  for (const auto& c : cases) job.push_back(to_json(c));
  const fs::path job_path = dir / "job.json";
  std::ofstream(job_path) << job.dump();
  LaunchOptions lo;
  lo.timeout = std::chrono::seconds(30);
  lo.output_dir = dir.string();
  lo.capture_output = true;
  lo.env = {{kJobVar, job_path.string()}, {"OMP_NUM_THREADS", "1"}};
  lo.timeout = std::chrono::seconds(30 * ranks / 2);
  LaunchResult lr = launch_local(ranks, {"exec_step_test"}, lo);
  EXPECT_EQ(lr.exit_code, 0) << lr.message;
  std::vector<std::vector<CaseResult>> out(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    for (std::size_t i = 0; i < cases.size(); ++i) {
      CaseResult cr;
      const std::string base = rank_file(dir.string(), r, ".case" + std::to_string(i));
      std::ifstream in(base + ".json");
      if (in) cr.json = nlohmann::json::parse(in);
      if (fs::exists(base + ".pt")) torch::load(cr.params, base + ".pt");
      const std::string trace = rank_trace_path((dir / ("trace" + std::to_string(i) + ".json")).string(), r);
      if (fs::exists(trace)) cr.trace = nlohmann::json::parse(std::ifstream(trace));
      out[static_cast<std::size_t>(r)].push_back(std::move(cr));
    }
  }
  fs::remove_all(dir);
  return out;
}

std::string label(const Case& c) {
  return c.model.name + " " + c.plan.label() + (c.delay_us > 0 ? " delay" : "");
}

void check_parity(const ModelSpec& m, const std::vector<PlanSpec>& plans, int delay_us, int steps = 10,
                  double rtol = 1e-5, double atol = 1e-6) {
  TrainResult ref = reference_run(m, make_plan(m, 1, {}), steps);
  std::vector<Case> cases;
  for (const auto& p : plans) cases.push_back({m, p, steps, delay_us, 0});
  auto results = launch(cases);
  for (int r = 0; r < 2; ++r) {
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const CaseResult& cr = results[static_cast<std::size_t>(r)][i];
      const std::string what = label(cases[i]) + " rank " + std::to_string(r);
      ASSERT_FALSE(cr.json.is_null()) << what << ": no result";
      ASSERT_FALSE(cr.json.contains("error")) << what << ": " << cr.json["error"];
      expect_losses_close(cr.json.at("losses").get<std::vector<double>>(), ref.losses, what, rtol, atol);
      ASSERT_EQ(cr.params.size(), ref.params.size()) << what;
      NamedTensors got;
      for (std::size_t k = 0; k < cr.params.size(); ++k) got.emplace_back(ref.params[k].first, cr.params[k]);
      expect_params_close(got, ref.params, what, rtol, atol);
    }
  }
}

// Every stage, reshard on/off, each offload flag, microbatches 1 and 4, checkpointing on/off.
std::vector<PlanSpec> parity_plans() {
  return {
      {0, 1},
      {0, 4, false, false, false, false, true},
      {1, 1, false, false, false, false, true},
      {1, 4},
      {1, 1, false, false, false, true},              // offload optimizer
      {1, 4, false, false, true, true},               // offload grads + optimizer
      {2, 1},
      {2, 4, false, false, false, false, true},
      {2, 1, false, false, true, true, true},
      {2, 4, false, false, false, false, false, "fp32", 60000},  // several reduce-scatter buckets (one-unit ones too)
      {2, 1, false, false, true, true, false, "fp32", 1},      // a bucket per unit, grads offloaded
      {3, 1, true},
      {3, 4, true, false, false, false, true},
      {3, 1, false},
      {3, 4, false, false, false, false, true},
      {3, 1, true, true},                             // offload params only
      {3, 4, true, false, false, true},               // offload optimizer only
      {3, 1, true, false, true, true},                // offload grads + optimizer
      {3, 4, true, true, true, true, true},           // everything offloaded
  };
}

TEST(ExecutorGlooParity, Gpt2TinyEveryPlan) { check_parity(gpt_tiny(), parity_plans(), 0); }
// Convolutions, BatchNorm and pooling on 2 ranks against a single process with the same micro batch
// (16): every stage, resharding, offload of grads, optimizer and parameters.
TEST(ExecutorGlooParity, ResnetTinyStagesOffload) {
  const std::vector<PlanSpec> plans = {{0, 1}, {1, 1}, {2, 1, false, false, true, true}, {3, 1, true},
                                       {3, 1, true, true, true, true}};
  // One step, at rtol 1e-5: the loss before it and every parameter after it. The reference's convolution
  // sums the 16-sample batch where each rank sums 8, in another order, and BatchNorm and momentum grow
  // that last-bit difference step by step: with the task's images as they are now (ATen's vectorized
  // normals, 2026-11-27) a second step leaves the reference by 3e-5 on the stem convolution's weight and a
  // third by 7e-4, the same for every plan (the ranks agree with each other). (With the earlier images,
  // Box-Muller one pixel at a time, 4 steps stayed within 1e-5.) The GPT's parity runs 10 steps; the
  // BatchNorm statistics around a recompute have their own test (pieces_compute_test.cpp).
  check_parity(resnet_tiny(16), plans, 0, 1);
}
// Checkpointed resnet (BatchNorm recomputed: its running statistics put back after the backward): one
// step at rtol 1e-5 (see ResnetTinyStagesOffload). Resnet with 2 microbatches per rank (the reference at
// the same micro batch, as BatchNorm normalises over it): one step within 1e-7 (measured 2.2e-8: a few
// ulps). The ranks sum (g0 + g1) + (g2 + g3) where the reference sums ((g0 + g1) + g2) + g3; that
// last-bit difference (7e-9 after one step) grows through BatchNorm and momentum over the steps, while
// one rank running the same 4 microbatches in order matches the reference at 1e-5 over 5 steps
// (measured 2026-11-24).
TEST(ExecutorGlooParity, ResnetTinyCheckpointingAndMicrobatches) {
  check_parity(resnet_tiny(16), {{0, 1, false, false, false, false, true}, {3, 1, true, false, false, false, true}}, 0, 1);
  check_parity(resnet_tiny(8), {{0, 2}, {2, 2}, {3, 2, true}}, 0, 1, 1e-6, 1e-7);
}
// Pipeline stages (stage-major ranks: rank = stage x dp + replica), 5 steps against the single-process
// reference: 2 ranks (2 stages) and 4 ranks (2 stages x 2 data-parallel ranks at ZeRO 0-2), GPipe with each
// of fairscale Pipe's checkpoint modes and 1F1B. gpt2-tiny's 4 units split [2, 2]: embed + block0 |
// block1 + head, so the head's tied token embedding crosses the stages (a replica on stage 1, its
// gradient added to the owner's, the update copied back). Every rank reports the pipeline's loss; the
// parameters of each replica's stages, in unit order, equal the reference's.
struct PipeSpec {
  int stages = 2, dp = 1;
  std::string schedule = "gpipe", checkpoint = "never";
  int microbatches = 4;
  int zero = 0;
  std::string label() const {
    return "pipe" + std::to_string(stages) + "x" + std::to_string(dp) + "_" + schedule + "_" + checkpoint + "_m" +
           std::to_string(microbatches) + "_zero" + std::to_string(zero);
  }
};

void check_pipeline_parity(const ModelSpec& m, const std::vector<PipeSpec>& specs, const std::vector<int>& balance,
                           int steps = 5) {
  TrainResult ref = reference_run(m, make_plan(m, 1, {}), steps);
  std::vector<Case> cases;
  const int ranks = specs.front().stages * specs.front().dp;
  for (const PipeSpec& s : specs) {
    ASSERT_EQ(s.stages * s.dp, ranks) << "one launch, one world size";
    Case c{m, {s.zero, s.microbatches}, steps, 0, 0};
    c.edit = [s, m, balance](Plan& p) {
      p = make_plan(m, s.stages * s.dp, {s.zero, s.microbatches});
      p.micro_batch = m.global_batch / (s.dp * s.microbatches);
      p.pipeline_stages = s.stages;
      p.pipeline.schedule = s.schedule;
      p.pipeline.checkpoint = s.checkpoint;
      p.pipeline.balance.mode = PipelineBalance::Mode::units;
      p.pipeline.balance.units = balance;
    };
    cases.push_back(c);
  }
  auto results = launch(cases, ranks);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const PipeSpec& s = specs[i];
    for (int d = 0; d < s.dp; ++d) {
      NamedTensors got;
      for (int st = 0; st < s.stages; ++st) {
        const int r = st * s.dp + d;
        const CaseResult& cr = results[static_cast<std::size_t>(r)][i];
        const std::string what = s.label() + " rank " + std::to_string(r);
        ASSERT_FALSE(cr.json.is_null()) << what << ": no result";
        ASSERT_FALSE(cr.json.contains("error")) << what << ": " << cr.json["error"];
        expect_losses_close(cr.json.at("losses").get<std::vector<double>>(), ref.losses, what);
        EXPECT_EQ(cr.json.at("pipeline_stage").get<int>(), st) << what;
        for (const auto& t : cr.params) got.emplace_back("", t);
      }
      ASSERT_EQ(got.size(), ref.params.size()) << s.label() << " replica " << d;
      for (std::size_t k = 0; k < got.size(); ++k) got[k].first = ref.params[k].first;
      expect_params_close(got, ref.params, s.label() + " replica " + std::to_string(d));
    }
  }
}

TEST(ExecutorGlooParity, PipelineTwoStages) {
  check_pipeline_parity(gpt_tiny(), {{2, 1, "gpipe", "never"}, {2, 1, "gpipe", "always"}, {2, 1, "gpipe", "except_last"},
                                     {2, 1, "1f1b", "never"}, {2, 1, "1f1b", "never", 2, 1}},
                        {2, 2});
}
TEST(ExecutorGlooParity, PipelineTwoStagesTwoReplicas) {
  check_pipeline_parity(gpt_tiny(), {{2, 2, "gpipe", "never", 2, 0}, {2, 2, "gpipe", "always", 2, 1},
                                     {2, 2, "gpipe", "except_last", 2, 2}, {2, 2, "1f1b", "never", 2, 0},
                                     {2, 2, "1f1b", "never", 4, 2}},
                        {2, 2});
}
// Four stages of one unit each on 4 ranks: activations pass through stages that neither start nor end
// the model, and the tied embedding goes between stages 0 and 3, which are not neighbours.
TEST(ExecutorGlooParity, PipelineFourStages) {
  check_pipeline_parity(gpt_tiny(), {{4, 1, "gpipe", "except_last"}, {4, 1, "gpipe", "always"}, {4, 1, "1f1b", "never"},
                                     {4, 1, "1f1b", "never", 4, 2}},
                        {1, 1, 1, 1});
}

TEST(ExecutorGlooParity, MlpOddParameterCountEveryPlan) { check_parity(mlp_odd(), parity_plans(), 0); }
TEST(ExecutorGlooParity, DelayBeforeCollectives) {
  check_parity(gpt_tiny(), {{0, 2}, {2, 2}, {3, 2, true, false, false, false, true}}, 500);
}

// 16-bit plans on 2 Gloo ranks against one in-process rank running the same plan (the executor: plain
// libtorch has no 16-bit master-weight training to compare with), every stage, with resharding,
// microbatches, checkpointing and offload: bf16 rtol 1.6e-2, fp16 (dynamic loss scale) 1e-3.
void check_mixed_parity(const ModelSpec& m, const std::vector<PlanSpec>& plans, int steps, double rtol) {
  static std::unique_ptr<Device> device = make_device("cpu");
  std::vector<Case> cases;
  for (const auto& p : plans) cases.push_back({m, p, steps, 0, 0});
  auto results = launch(cases);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto ref = thread_run(m, make_plan(m, 1, {0, 1, false, false, false, false, false, plans[i].dtype}), steps, *device);
    for (int r = 0; r < 2; ++r) {
      const CaseResult& cr = results[static_cast<std::size_t>(r)][i];
      const std::string what = label(cases[i]) + " rank " + std::to_string(r);
      ASSERT_FALSE(cr.json.is_null()) << what << ": no result";
      ASSERT_FALSE(cr.json.contains("error")) << what << ": " << cr.json["error"];
      expect_losses_close(cr.json.at("losses").get<std::vector<double>>(), ref[0].local_losses, what, rtol, rtol);
      NamedTensors got;
      for (std::size_t k = 0; k < cr.params.size(); ++k) got.emplace_back(ref[0].params[k].first, cr.params[k]);
      expect_params_close(got, ref[0].params, what, rtol, rtol);
    }
  }
}

std::vector<PlanSpec> mixed_plans(const std::string& dtype) {
  return {{0, 1, false, false, false, false, false, dtype},
          {1, 2, false, false, false, false, false, dtype},
          {1, 1, false, false, false, true, false, dtype},
          {2, 1, false, false, false, false, true, dtype},
          {2, 1, false, false, true, true, false, dtype},
          {3, 1, true, false, false, false, false, dtype},
          {3, 2, false, false, false, false, true, dtype},
          {3, 1, true, true, true, true, false, dtype}};
}

TEST(ExecutorGlooParity, Gpt2TinyBf16EveryStage) { check_mixed_parity(gpt_tiny(), mixed_plans("bf16"), 10, 1.6e-2); }
TEST(ExecutorGlooParity, Gpt2TinyFp16EveryStage) { check_mixed_parity(gpt_tiny(), mixed_plans("fp16"), 10, 1e-3); }

// Measured peaks fall as the plan predicts, and the limit fails stage 0 where stage 3 + offload runs.
TEST(ExecutorGlooMemory, Stage3OffloadBelowStage0AndLimit) {
  const ModelSpec m = gpt_tiny();
  const PlanSpec s0{0, 1};
  const PlanSpec s3{3, 1, true, true, true, true};
  auto free_run = launch({{m, s0, 3, 0, 0}, {m, s3, 3, 0, 0}});
  std::int64_t peak0 = 0, peak3 = 0;
  for (int r = 0; r < 2; ++r) {
    const auto& rr = free_run[static_cast<std::size_t>(r)];
    ASSERT_FALSE(rr[0].json.contains("error")) << rr[0].json.dump();
    ASSERT_FALSE(rr[1].json.contains("error")) << rr[1].json.dump();
    peak0 = std::max(peak0, rr[0].json.at("device_peak_bytes").get<std::int64_t>());
    peak3 = std::max(peak3, rr[1].json.at("device_peak_bytes").get<std::int64_t>());
    EXPECT_GT(rr[1].json.at("host_peak_bytes").get<std::int64_t>(), 0);
    EXPECT_EQ(rr[0].json.at("host_peak_bytes").get<std::int64_t>(), 0);
  }
  std::printf("gpt2-tiny device peak per rank: stage 0 %lld B, stage 3 + offload %lld B\n",
              static_cast<long long>(peak0), static_cast<long long>(peak3));
  EXPECT_LT(peak3, peak0);

  const std::int64_t limit = (peak0 + peak3) / 2;
  auto limited = launch({{m, s3, 3, 0, limit}, {m, s0, 3, 0, limit}});
  for (int r = 0; r < 2; ++r) {
    const auto& rr = limited[static_cast<std::size_t>(r)];
    EXPECT_FALSE(rr[0].json.contains("error")) << rr[0].json.dump();
    ASSERT_TRUE(rr[1].json.contains("error"));
    const std::string msg = rr[1].json["error"];
    EXPECT_EQ(msg.rfind("out of device memory in unit ", 0), 0u) << msg;
    EXPECT_NE(msg.find(", phase "), std::string::npos) << msg;
    EXPECT_NE(msg.find(" bytes, limit " + std::to_string(limit)), std::string::npos) << msg;
  }
}

// Stage 3 in fp32 without clipping (Plan::steps_beside_last_reduce_scatter): each step's optimizer is two
// spans, the units whose reduce-scatters landed and then, once the last one (the embedding's) is waited,
// that unit; with clipping one span after every reduce-scatter. (Whether the first span overlaps the last
// reduce-scatter is timing on a model this small: the simulator's test asserts it.) (The results equal the reference's: the
// parity cases above at stage 3.)
TEST(ExecutorGlooMeasurement, Stage3StepsLandedUnitsBesideTheLastReduceScatter) {
  const ModelSpec m = gpt_tiny();
  Case beside{m, PlanSpec{3, 1, true}, 3, 0, 0, true};
  Case clipped = beside;
  clipped.edit = [](Plan& p) { p.optimizer.max_grad_norm = 1.0; };
  ASSERT_TRUE(case_plan(beside).steps_beside_last_reduce_scatter());
  ASSERT_FALSE(case_plan(clipped).steps_beside_last_reduce_scatter());
  auto results = launch({beside, clipped});
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 2; ++i) {
      const CaseResult& cr = results[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
      ASSERT_FALSE(cr.json.is_null() || cr.json.contains("error")) << cr.json.dump();
      std::map<int, std::vector<double>> step_starts;  // per step: its optimizer spans' starts
      std::map<int, double> last_rs_end;
      for (const auto& e : cr.trace.at("traceEvents")) {
        if (e.at("ph") != "X" || !e.contains("args") || !e.at("args").contains("step")) continue;
        const std::string name = e.at("name").get<std::string>();
        const int step = e.at("args").at("step").get<int>();
        const double ts = e.at("ts").get<double>();
        if (name == "optimizer") step_starts[step].push_back(ts);
        if (name.rfind("reduce_scatter", 0) == 0)
          last_rs_end[step] = std::max(last_rs_end[step], ts + e.at("dur").get<double>());
      }
      ASSERT_EQ(step_starts.size(), 3u) << "rank " << r << " case " << i;
      for (auto& [step, starts] : step_starts) {
        std::sort(starts.begin(), starts.end());
        EXPECT_EQ(starts.size(), i == 0 ? 2u : 1u) << "rank " << r << " case " << i << " step " << step;
        EXPECT_GE(starts.back(), last_rs_end[step]) << "rank " << r << " case " << i << " step " << step;
      }
    }
  }
}

// Activation offload's copies run on the side lane; each step records the seconds it copied each way in
// the phases `d2h` and `h2d`, the simulator's lanes of those names (compare reads them row by row).
TEST(ExecutorGlooMeasurement, SideLaneCopiesAreRecordedEachWay) {
  Case c{gpt_tiny(), PlanSpec{0, 1}, 3};
  c.edit = [](Plan& p) { p.offload.activations_ratio = 1.0; };
  auto results = launch({c});
  for (int r = 0; r < 2; ++r) {
    const CaseResult& cr = results[static_cast<std::size_t>(r)][0];
    ASSERT_FALSE(cr.json.is_null() || cr.json.contains("error")) << cr.json.dump();
    RunResult rr;
    exec::from_json(cr.json, rr);
    ASSERT_EQ(rr.phase_times_s.size(), 3u);
    for (const auto& phases : rr.phase_times_s) {
      EXPECT_GT(phases.count("d2h") ? phases.at("d2h") : 0.0, 0.0) << "rank " << r;
      EXPECT_GT(phases.count("h2d") ? phases.at("h2d") : 0.0, 0.0) << "rank " << r;
      EXPECT_EQ(phases.count("side_lane"), 0u) << "rank " << r;
    }
  }
}

// The ranks' results merge into a valid RunRecord; each rank's trace has the simulator's lanes and
// memory counters.
TEST(ExecutorGlooMeasurement, RunRecordAndTraces) {
  const ModelSpec m = gpt_tiny();
  Case c{m, PlanSpec{3, 2, true, false, true, true, true}, 4, 0, 0, true};
  auto results = launch({c});
  std::vector<RunResult> ranks;
  for (int r = 0; r < 2; ++r) {
    const CaseResult& cr = results[static_cast<std::size_t>(r)][0];
    ASSERT_FALSE(cr.json.is_null() || cr.json.contains("error")) << cr.json.dump();
    RunResult rr;
    exec::from_json(cr.json, rr);
    ranks.push_back(rr);
    std::set<std::string> lanes, names;
    int memory_counters = 0;
    for (const auto& e : cr.trace.at("traceEvents")) {
      if (e.at("ph") == "C" && e.at("name") == "memory device" && e.at("args").at("bytes").get<std::int64_t>() > 0)
        ++memory_counters;
      if (e.at("ph") == "M" && e.at("name") == "thread_name") lanes.insert(e.at("args").at("name").get<std::string>());
      if (e.at("ph") == "X") {
        const std::string name = e.at("name").get<std::string>();
        names.insert(name.substr(0, name.find(' ')));
        EXPECT_GE(e.at("dur").get<double>(), 0.0);
        // Stage 3's reduce-scatters run on a communicator of their own, tracked on their own lane.
        if (name.rfind("reduce_scatter", 0) == 0) {
          EXPECT_EQ(e.at("tid"), static_cast<int>(Lane::comm_rs)) << name;
        }
        if (name.rfind("all_gather", 0) == 0) {
          EXPECT_EQ(e.at("tid"), static_cast<int>(Lane::comm)) << name;
        }
      }
    }
    EXPECT_EQ(lanes, (std::set<std::string>{"compute", "comm", "h2d", "d2h", "optimizer", "comm.rs"}));
    EXPECT_GT(memory_counters, 0) << "rank " << r << " trace has no memory device counters";
    for (const char* n : {"forward", "backward", "recompute", "all_gather", "reduce_scatter", "optimizer", "d2h", "h2d"}) {
      EXPECT_TRUE(names.count(n)) << "rank " << r << " trace has no " << n;
    }
  }
  RunOptions opt;
  opt.model = m.name;
  opt.preset = m.preset;
  opt.plan = make_plan(m, 2, c.plan);
  opt.steps = 4;
  opt.warmup_steps = 1;
  RunRecord rec = merge_results(opt, ranks);
  EXPECT_NO_THROW(validate(rec));
  EXPECT_EQ(rec.step_times_s.size(), 4u);
  EXPECT_EQ(rec.losses.size(), 4u);
  EXPECT_EQ(rec.peaks.size(), 2u);
  EXPECT_EQ(rec.trace_paths.size(), 2u);
  for (const char* phase : {"forward", "backward", "optimizer", "all_gather", "reduce_scatter", "comm_wait"}) {
    EXPECT_TRUE(rec.phase_times_s.count(phase)) << phase;
  }
  EXPECT_GT(rec.peaks[0].host_peak_bytes, 0);
  // The host pool's high-water mark over the whole run (set-up included): on CPU no block rounding.
  for (const RankPeak& p : rec.peaks) EXPECT_GE(p.host_reserved_bytes, p.host_peak_bytes) << p.rank;
  // The ranks computed with 1 thread each (rank_main), and the record says so.
  EXPECT_EQ(rec.environment.threads_per_rank, 1);
  // Both ranks on this machine: its cores and the load other programs put on it were measured (/proc).
  EXPECT_EQ(rec.environment.cores, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_GE(rec.environment.other_load_cores, 0);
  EXPECT_LE(rec.environment.other_load_cores, rec.environment.cores);

  // Per unit (2 microbatches, checkpointed): every unit of the model in order on every rank, forward
  // and backward > 0; the record has the slowest rank's per unit and phase; one microbatch's forward
  // and backward of every unit, times the microbatches, fit in the median step.
  std::vector<std::string> names;
  for (const auto& u : build_run_model(opt).units) names.push_back(u.name);
  ASSERT_EQ(rec.units.size(), names.size());
  double units_s = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const UnitPhaseTime& u = rec.units[i];
    EXPECT_EQ(u.name, names[i]);
    EXPECT_GT(u.fwd_s, 0) << u.name;
    EXPECT_GT(u.bwd_s, 0) << u.name;
    double fwd = 0, bwd = 0;
    for (const RunResult& r : ranks) {
      ASSERT_EQ(r.units.size(), names.size()) << "rank " << r.rank;
      EXPECT_EQ(r.units[i].name, names[i]);
      EXPECT_GT(r.units[i].fwd_s, 0);
      EXPECT_GT(r.units[i].bwd_s, 0);
      fwd = std::max(fwd, r.units[i].fwd_s);
      bwd = std::max(bwd, r.units[i].bwd_s);
    }
    EXPECT_DOUBLE_EQ(u.fwd_s, fwd) << u.name;
    EXPECT_DOUBLE_EQ(u.bwd_s, bwd) << u.name;
    units_s += (u.fwd_s + u.bwd_s) * opt.plan.microbatches;
  }
  EXPECT_LT(units_s, rec.step_time_median_s);
  // Through JSON as a RunRecord, units included.
  nlohmann::json j;
  zeroplan::to_json(j, rec);
  RunRecord back;
  zeroplan::from_json(j, back);
  EXPECT_EQ(back.units, rec.units);
}

// ---- LocalSGD, SlowMo, AdaScale (exec/src/step/localsgd.cpp, adascale.cpp) ----

std::vector<std::pair<std::string, std::int64_t>> calls_of(const CaseResult& cr) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  if (cr.json.contains("calls")) {
    for (const auto& c : cr.json.at("calls")) out.emplace_back(c[0].get<std::string>(), c[1].get<std::int64_t>());
  }
  return out;
}

void expect_ok(const CaseResult& cr, const std::string& what) {
  ASSERT_FALSE(cr.json.is_null()) << what << ": no result";
  ASSERT_FALSE(cr.json.contains("error")) << what << ": " << cr.json["error"];
}

bool params_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

ModelSpec sgd_gpt() {
  ModelSpec m = gpt_tiny();
  m.optimizer.name = "sgd";
  m.optimizer.lr = 0.05;
  return m;
}

// One rank per node, LocalSGD every 3 steps after 2 synchronous ones: gradients are all-reduced in the
// warm-up steps only (in DDP's buckets), parameters (one all-reduce of the flat buffer) after steps 2
// and 5; the replicas differ between averages and are equal right after one. With the warm-up covering
// the run, LocalSGD is DDP bit for bit.
TEST(ExecutorLocalSgd, AveragesEveryHStepsAndNoGradientReductionBetween) {
  const ModelSpec m = sgd_gpt();
  auto small_buckets = [](Plan& p) { p.buckets.all_reduce_bucket_bytes = 64 << 10; };
  auto local = [&](int steps_warmup) {
    return [=](Plan& p) {
      small_buckets(p);
      p.localsgd_frequency = 3;
      p.localsgd_warmup_steps = steps_warmup;
    };
  };
  std::vector<Case> cases = {
      {m, {0, 1}, 6, 0, 0, false, small_buckets, 1},  // DDP
      {m, {0, 1}, 6, 0, 0, false, local(2), 1},       // averaged after step 5
      {m, {0, 1}, 7, 0, 0, false, local(2), 1},       // ends between averages
      {m, {0, 1}, 6, 0, 0, false, local(6), 1},       // warm-up covers the run
  };
  auto res = launch(cases);
  for (int r = 0; r < 2; ++r)
    for (std::size_t i = 0; i < cases.size(); ++i) expect_ok(res[static_cast<std::size_t>(r)][i], "case " + std::to_string(i));
  const auto ddp = calls_of(res[0][0]);
  ASSERT_EQ((ddp.size() - 1) % 6, 0u);
  const std::size_t buckets = (ddp.size() - 1) / 6;  // per step, then the losses' all-reduce
  ASSERT_GE(buckets, 2u) << "the test needs several gradient buckets";
  std::int64_t param_bytes = 0;
  for (std::size_t k = 0; k < buckets; ++k) param_bytes += ddp[k].second;
  for (int r = 0; r < 2; ++r) {
    const auto calls = calls_of(res[static_cast<std::size_t>(r)][1]);
    ASSERT_EQ(calls.size(), 2 * buckets + 3) << "rank " << r << ": 2 warm-up steps of buckets, 2 averages, losses";
    for (std::size_t k = 0; k < 2 * buckets; ++k) {
      EXPECT_EQ(calls[k], ddp[k]) << "warm-up collective " << k;
    }
    EXPECT_EQ(calls[2 * buckets], (std::pair<std::string, std::int64_t>{"all_reduce", param_bytes}));
    EXPECT_EQ(calls[2 * buckets + 1], (std::pair<std::string, std::int64_t>{"all_reduce", param_bytes}));
  }
  EXPECT_TRUE(params_equal(res[0][1].params, res[1][1].params)) << "replicas differ right after an average";
  EXPECT_FALSE(params_equal(res[0][2].params, res[1][2].params)) << "replicas equal between averages";
  EXPECT_FALSE(params_equal(res[0][1].params, res[0][0].params)) << "LocalSGD after warm-up equals DDP";
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(params_equal(res[static_cast<std::size_t>(r)][3].params, res[static_cast<std::size_t>(r)][0].params));
    EXPECT_EQ(res[static_cast<std::size_t>(r)][3].json.at("losses"), res[static_cast<std::size_t>(r)][0].json.at("losses"));
  }
}

// SlowMo's first slow update (u = 0 before it) on the averaged x_L of LocalSGD, from the initial x0:
// u = (x0 - x_L) / lr, x = x0 - lr alpha u = x0 + alpha (x_L - x0). Its two full-size fp32 buffers (slow
// momentum, previous parameters) show in the measured device peak.
TEST(ExecutorLocalSgd, SlowMoFirstUpdateClosedFormAndBuffers) {
  const ModelSpec m = sgd_gpt();
  const double alpha = 0.7;
  auto local = [](Plan& p) { p.localsgd_frequency = 2; };
  auto slowmo = [=](Plan& p) {
    p.localsgd_frequency = 2;
    p.slowmo_frequency = 2;
    p.slowmo_momentum = 0.5;
    p.slowmo_lr = alpha;
  };
  // Momentum 0 and slow lr 1: the slow update is the identity, so fairscale's SlowMo is LocalSGD.
  auto identity = [](Plan& p) {
    p.localsgd_frequency = 2;
    p.slowmo_frequency = 2;
    p.slowmo_momentum = 0;
    p.slowmo_lr = 1;
  };
  auto res = launch({{m, {0, 1}, 2, 0, 0, false, local, 1},
                     {m, {0, 1}, 2, 0, 0, false, slowmo, 1},
                     {m, {0, 1}, 2, 0, 0, false, identity, 1}});
  const NamedTensors x0 = named_params(build(m, 7));
  for (int r = 0; r < 2; ++r) {
    const auto& rr = res[static_cast<std::size_t>(r)];
    expect_ok(rr[0], "localsgd");
    expect_ok(rr[1], "slowmo");
    expect_ok(rr[2], "slowmo momentum 0, lr 1");
    EXPECT_TRUE(params_equal(rr[2].params, rr[0].params)) << "rank " << r << ": identity SlowMo differs from LocalSGD";
    ASSERT_EQ(rr[0].params.size(), x0.size());
    NamedTensors got, want;
    for (std::size_t k = 0; k < x0.size(); ++k) {
      got.emplace_back(x0[k].first, rr[1].params[k]);
      want.emplace_back(x0[k].first, x0[k].second + alpha * (rr[0].params[k] - x0[k].second));
    }
    expect_params_close(got, want, "slowmo rank " + std::to_string(r), 1e-4, 1e-6);
    std::int64_t elems = 0;
    for (const auto& t : rr[0].params) elems += t.numel();
    const double extra = static_cast<double>(rr[1].json.at("device_peak_bytes").get<std::int64_t>() -
                                             rr[0].json.at("device_peak_bytes").get<std::int64_t>());
    EXPECT_NEAR(extra, 8.0 * static_cast<double>(elems), 0.02 * 8.0 * static_cast<double>(elems)) << "rank " << r;
  }
}

// AdaScale on one rank with one microbatch (S = 1): the gain is 1, so every step is plain SGD's, bit
// for bit, over 5 steps.
TEST(ExecutorAdaScale, OneRankIsPlainSgd) {
  static std::unique_ptr<Device> device = make_device("cpu");
  const ModelSpec m = sgd_gpt();
  Plan ada = make_plan(m, 1, {0, 1});
  ada.adascale = true;
  const auto a = thread_run(m, ada, 5, *device);
  const auto plain = thread_run(m, make_plan(m, 1, {0, 1}), 5, *device);
  ASSERT_EQ(a[0].params.size(), plain[0].params.size());
  for (std::size_t k = 0; k < a[0].params.size(); ++k) {
    EXPECT_TRUE(torch::equal(a[0].params[k].second, plain[0].params[k].second)) << a[0].params[k].first;
  }
  EXPECT_EQ(a[0].local_losses, plain[0].local_losses);
}

// AdaScale on 2 ranks: the gain of every step lies in [1, S = 2]; the first step equals plain SGD at
// lr x that step's gain.
TEST(ExecutorAdaScale, GainScalesTheStepLikePlainSgd) {
  const ModelSpec m = sgd_gpt();
  auto res = launch({{m, {0, 1}, 3, 0, 0, false, [](Plan& p) { p.adascale = true; }}});
  std::vector<double> gains;
  for (int r = 0; r < 2; ++r) {
    expect_ok(res[static_cast<std::size_t>(r)][0], "adascale");
    const auto g = res[static_cast<std::size_t>(r)][0].json.at("lr_gains").get<std::vector<double>>();
    ASSERT_EQ(g.size(), 3u);
    for (double x : g) {
      EXPECT_GE(x, 1.0 - 1e-9);
      EXPECT_LE(x, 2.0 + 1e-9);
    }
    if (r == 1) {
      EXPECT_EQ(g, gains) << "the ranks disagree on the gain";
    }
    gains = g;
  }
  const double g0 = gains[0];
  auto first = launch({{m, {0, 1}, 1, 0, 0, false, [](Plan& p) { p.adascale = true; }},
                       {m, {0, 1}, 1, 0, 0, false, [g0](Plan& p) { p.optimizer.lr *= g0; }}});
  for (int r = 0; r < 2; ++r) {
    const auto& rr = first[static_cast<std::size_t>(r)];
    expect_ok(rr[0], "adascale");
    expect_ok(rr[1], "sgd");
    NamedTensors got, want;
    for (std::size_t k = 0; k < rr[0].params.size(); ++k) {
      got.emplace_back(std::to_string(k), rr[0].params[k]);
      want.emplace_back(std::to_string(k), rr[1].params[k]);
    }
    expect_params_close(got, want, "adascale step 0 rank " + std::to_string(r), 1e-6, 1e-7);
  }
}

// checkpoint_offload (fairscale checkpoint_wrapper(offload_to_cpu=True)) moves each checkpointed unit's
// kept input to the host and back for the recompute: losses and parameters equal the same checkpointed
// plan without it bit for bit on 2 ranks (gpt and resnet, stages 0 and 3), the host pool held the inputs
// and, at stage 0, the device never more.
TEST(ExecutorGlooParity, CheckpointOffloadChangesNoArithmetic) {
  auto offload = [](Plan& p) { p.checkpoint_offload = true; };
  for (const ModelSpec& m : {gpt_tiny(), resnet_tiny(16)}) {
    const PlanSpec s0{0, 1, false, false, false, false, true}, s3{3, 1, true, false, false, false, true};
    auto res = launch({{m, s0, 4}, {m, s0, 4, 0, 0, false, offload}, {m, s3, 4}, {m, s3, 4, 0, 0, false, offload}});
    for (int r = 0; r < 2; ++r) {
      const auto& rr = res[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < rr.size(); ++i) expect_ok(rr[i], m.name + " case " + std::to_string(i));
      for (std::size_t i : {std::size_t{1}, std::size_t{3}}) {
        const std::string what = m.name + " rank " + std::to_string(r) + (i == 1 ? " stage 0" : " stage 3");
        EXPECT_TRUE(params_equal(rr[i].params, rr[i - 1].params)) << what;
        EXPECT_EQ(rr[i].json.at("losses"), rr[i - 1].json.at("losses")) << what;
        EXPECT_GT(rr[i].json.at("host_peak_bytes").get<std::int64_t>(), rr[i - 1].json.at("host_peak_bytes").get<std::int64_t>())
            << what << ": the host held no input";
        // Never more on the device at stage 0 (how much less depends on where the peak falls:
        // fidelity.memory). Not compared at stage 3, whose peak moves by a few KiB with the timing of the
        // prefetch all-gathers from run to run.
        if (i == 1) {
          EXPECT_LE(rr[i].json.at("device_peak_bytes").get<std::int64_t>(), rr[i - 1].json.at("device_peak_bytes").get<std::int64_t>())
              << what;
        }
      }
    }
  }
}

// Activation offload (hfai's offload_ratio, per saved tensor) moves tensors to the host and back, never
// the arithmetic: on 2 ranks, losses and parameters equal the same plan without it bit for bit, for
// ratios 0.1, 0.5 and 1, with no prefetch, with 2 microbatches, with some units checkpointed and at
// stage 3, on the GPT and on the resnet (BatchNorm). The RunResult lists what went (every tensor at ratio
// 1, about half the bytes at 0.5), the host held exactly that, and at ratio 1 the device held less.
TEST(ExecutorGlooParity, ActivationOffloadChangesNoArithmetic) {
  // Unit 1 checkpointed (the others kept) where `ckpt`.
  auto ratio = [](double r, std::int64_t prefetch = -1, bool ckpt = false) {
    return [=](Plan& p) {
      p.offload.activations_ratio = r;
      p.offload.activations_prefetch_bytes = prefetch;
      if (ckpt) p.checkpointing = {Checkpointing::Mode::units, {1}};
    };
  };
  auto ckpt_only = [](Plan& p) { p.checkpointing = {Checkpointing::Mode::units, {1}}; };
  for (const ModelSpec& m : {gpt_tiny(), resnet_tiny(16)}) {
    const PlanSpec s0{0, 1}, s0m2{0, 2}, s3{3, 1, true};
    // {case, its reference}
    const std::vector<std::pair<std::size_t, std::size_t>> pairs = {{1, 0}, {2, 0}, {3, 0}, {4, 0}, {6, 5}, {8, 7}, {10, 9}};
    auto res = launch({{m, s0, 3},
                       {m, s0, 3, 0, 0, false, ratio(0.1)},
                       {m, s0, 3, 0, 0, false, ratio(0.5)},
                       {m, s0, 3, 0, 0, false, ratio(1)},
                       {m, s0, 3, 0, 0, false, ratio(1, 0)},
                       {m, s0m2, 3},
                       {m, s0m2, 3, 0, 0, false, ratio(0.5)},
                       {m, s0, 3, 0, 0, false, ckpt_only},
                       {m, s0, 3, 0, 0, false, ratio(1, -1, true)},
                       {m, s3, 3},
                       {m, s3, 3, 0, 0, false, ratio(0.5)}});
    for (int r = 0; r < 2; ++r) {
      const auto& rr = res[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < rr.size(); ++i) expect_ok(rr[i], m.name + " case " + std::to_string(i));
      for (const auto& [i, ref] : pairs) {
        const std::string what = m.name + " rank " + std::to_string(r) + " case " + std::to_string(i);
        EXPECT_TRUE(params_equal(rr[i].params, rr[ref].params)) << what;
        EXPECT_EQ(rr[i].json.at("losses"), rr[ref].json.at("losses")) << what;
        const auto& off = rr[i].json.at("offloaded_activations");
        ASSERT_FALSE(off.empty()) << what;
        std::int64_t bytes = 0, sent = 0;
        for (const auto& u : off) {
          bytes += u.at("bytes").get<std::int64_t>();
          sent += u.at("offloaded_bytes").get<std::int64_t>();
        }
        EXPECT_GT(sent, 0) << what;
        // The host pool held this microbatch's offloaded tensors (and nothing else in these plans).
        EXPECT_EQ(rr[i].json.at("host_peak_bytes").get<std::int64_t>(), sent) << what;
        if (i == 3 || i == 4) {
          EXPECT_EQ(sent, bytes) << what << ": ratio 1 sends everything";
        }
        if (i == 2) {
          EXPECT_NEAR(static_cast<double>(sent), 0.5 * static_cast<double>(bytes), 0.1 * static_cast<double>(bytes)) << what;
        }
        if (i == 3) {
          EXPECT_LT(rr[i].json.at("device_peak_bytes").get<std::int64_t>(), rr[ref].json.at("device_peak_bytes").get<std::int64_t>())
              << what;
        }
      }
      EXPECT_TRUE(rr[0].json.at("offloaded_activations").empty());
    }
  }
}

// fairscale OffloadModel moves parameters, gradients and activations between the host and the device,
// never the arithmetic: on 2 ranks its losses and parameters equal stage 0's bit for bit, with 1, 2 and 4
// slices, with and without checkpoint_activation, with the micro batch in 2 chunks (against stage 0 with
// those chunks as microbatches: the same samples, summed in the same order) and with 2 accumulation
// microbatches (the gradients carried to the host and back). The host held the model states, and with
// several slices the device held less than stage 0.
TEST(ExecutorGlooParity, OffloadModelChangesNoArithmetic) {
  const ModelSpec m = gpt_tiny();
  // With chunks, the head's gradient of a tied weight is added for every chunk before the embedding's
  // (its slice comes later in backward), where stage 0's microbatches alternate them: another order of
  // the same sums. The chunked cases run the untied model.
  ModelSpec untied = gpt_tiny();
  untied.options["tied"] = "false";
  auto om = [](int slices, int chunks, bool ckpt) {
    return [=](Plan& p) {
      p.offload_model.enabled = true;
      p.offload_model.slices = slices;
      p.offload_model.microbatches = chunks;
      p.offload_model.checkpoint_activation = ckpt;
    };
  };
  const PlanSpec m1{0, 1}, m2{0, 2};
  // {case, its reference, slices > 1}
  const std::vector<std::tuple<std::size_t, std::size_t, bool>> pairs = {
      {1, 0, false}, {2, 0, true}, {3, 0, true}, {4, 0, true}, {7, 6, true}, {8, 6, true}, {9, 5, true}, {10, 5, true}};
  auto res = launch({{m, m1, 3},
                     {m, m1, 3, 0, 0, false, om(1, 1, false)},
                     {m, m1, 3, 0, 0, false, om(2, 1, false)},
                     {m, m1, 3, 0, 0, false, om(4, 1, true)},
                     {m, m1, 3, 0, 0, false, om(2, 1, true)},
                     {m, m2, 3},
                     {untied, m2, 3},
                     {untied, m1, 3, 0, 0, false, om(2, 2, false)},
                     {untied, m1, 3, 0, 0, false, om(4, 2, true)},
                     {m, m2, 3, 0, 0, false, om(2, 1, false)},
                     {m, m2, 3, 0, 0, false, om(3, 1, true)}});
  for (int r = 0; r < 2; ++r) {
    const auto& rr = res[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < rr.size(); ++i) expect_ok(rr[i], "case " + std::to_string(i));
    for (const auto& [i, ref, sliced] : pairs) {
      const std::string what = "rank " + std::to_string(r) + " case " + std::to_string(i);
      EXPECT_TRUE(params_equal(rr[i].params, rr[ref].params)) << what;
      EXPECT_EQ(rr[i].json.at("losses"), rr[ref].json.at("losses")) << what;
      EXPECT_GT(rr[i].json.at("host_peak_bytes").get<std::int64_t>(), rr[ref].json.at("host_peak_bytes").get<std::int64_t>())
          << what << ": the host held nothing";
      if (sliced) {
        EXPECT_LT(rr[i].json.at("device_peak_bytes").get<std::int64_t>(), rr[ref].json.at("device_peak_bytes").get<std::int64_t>())
            << what;
      }
    }
  }
}

// Checkpoint and resume: 3 steps, a checkpoint, 3 more steps from it equal 6 uninterrupted steps bit for
// bit (losses and parameters), at every stage on the same 2 ranks; and across world sizes, 2 ranks to 1
// and 1 to 2. One rank runs the global batch as 2 microbatches of the ranks' micro batch, so it sees
// their samples and sums the same two gradients (the LM head untied: a tied weight's two gradients would
// be summed in another order across microbatches than across ranks at stages 0-1).
TEST(ExecutorGlooParity, ResumeEqualsAnUninterruptedRun) {
  namespace fs = std::filesystem;
  ModelSpec m = gpt_tiny();
  m.options["tied"] = "false";
  const fs::path root = fs::temp_directory_path() / ("zeroplan_ckpt_" + std::to_string(::getpid()));
  for (int stage : {0, 1, 2, 3}) {
    const std::string at = "stage " + std::to_string(stage);
    const fs::path two = root / ("two" + std::to_string(stage)), one = root / ("one" + std::to_string(stage));
    // One rank: 3 steps, checkpointed after the last.
    RunOptions single;
    single.model = m.name;
    single.preset = m.preset;
    single.model_options = m.options;
    single.plan = make_plan(m, 1, {stage, 2});
    single.steps = 3;
    single.warmup_steps = 0;
    single.checkpoint_dir = one.string();
    single.threads = 1;  // as the ranks compute (another thread count may round GEMMs differently)
    {
      LocalCommunicator comm;
      run_rank(single, comm);
    }
    ASSERT_EQ(newest_checkpoint(one.string()), 3) << at;
    const PlanSpec s{stage, 1};
    Case full{m, s, 6}, first{m, s, 3}, resumed{m, s, 3}, from_one{m, s, 3};
    first.checkpoint_dir = two.string();
    resumed.resume_dir = two.string();
    from_one.resume_dir = one.string();
    auto res = launch({full, first, resumed, from_one});
    // Two ranks to one.
    RunOptions back = single;
    back.checkpoint_dir.clear();
    back.resume_dir = two.string();
    back.keep_parameters = true;
    RunResult to_one;
    {
      LocalCommunicator comm;
      to_one = run_rank(back, comm);
    }
    const auto& want = res[0][0];
    expect_ok(want, at);
    const std::vector<double> tail(want.json.at("losses").begin() + 3, want.json.at("losses").end());
    std::vector<torch::Tensor> to_one_params;
    for (auto& [n, t] : to_one.parameters) to_one_params.push_back(t);
    EXPECT_TRUE(params_equal(to_one_params, want.params)) << at << ": 2 ranks -> 1";
    EXPECT_EQ(to_one.losses, tail) << at << ": 2 ranks -> 1";
    for (int r = 0; r < 2; ++r) {
      const auto& rr = res[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < rr.size(); ++i) expect_ok(rr[i], at + " case " + std::to_string(i));
      const std::string what = at + " rank " + std::to_string(r);
      EXPECT_TRUE(params_equal(rr[2].params, want.params)) << what << ": resumed on 2 ranks";
      EXPECT_EQ(rr[2].json.at("losses").get<std::vector<double>>(), tail) << what << ": resumed on 2 ranks";
      EXPECT_TRUE(params_equal(rr[3].params, want.params)) << what << ": 1 rank -> 2";
      EXPECT_EQ(rr[3].json.at("losses").get<std::vector<double>>(), tail) << what << ": 1 rank -> 2";
    }
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace zeroplan::exec::testing
