#include "zeroplan/sim/simulate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "fixtures.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/sim/errors.h"
#include "zeroplan/sim/memory_bound.h"

namespace zeroplan::sim {
namespace {

using testing::a100;
using testing::gpt;
using testing::mixed_plan;

// A model of `units` identical Linear units of `params` each, with tiny activations.
ModelProfile linear_stack(int units, std::int64_t params) {
  ModelProfile m;
  m.name = "stack";
  m.source = "analytic:stack";
  m.measured = false;
  m.device = "analytic";
  m.dtype = "fp16";
  UnitProfile u;
  u.name = "lin";
  u.type = "Linear";
  u.count = units;
  u.params = params;
  u.bytes_param = 2 * params;
  u.bytes_output = Figure::proportional(1024, 1);
  u.bytes_saved = Figure::proportional(1024, 1);
  u.flops_fwd = Figure::proportional(2.0 * static_cast<double>(params), 1);
  u.flops_bwd = Figure::proportional(4.0 * static_cast<double>(params), 1);
  m.units = {u};
  return m;
}

TEST(ZeroPaper, ModelStatesOfStages0To3) {
  // 7.5e9 parameters, 64 ranks, mixed-precision Adam: (2 + 2 + 12) x P split per stage.
  const ModelProfile m = linear_stack(7500, 1'000'000);
  const ClusterProfile c = a100(8);
  const double P = 7.5e9;
  const double exact[4] = {16 * P, 4 * P + 12 * P / 64, 2 * P + 14 * P / 64, 16 * P / 64};
  const double paper[4] = {120.0, 31.4, 16.6, 1.9};
  for (int stage = 0; stage <= 3; ++stage) {
    const Plan plan = mixed_plan(64, stage);
    const Simulation s = simulate_step(m, c, plan);
    const double states = static_cast<double>(s.explain.device.model_state_bytes());
    EXPECT_NEAR(states, exact[stage], 0.1e9) << "stage " << stage;
    EXPECT_NEAR(states / 1e9, paper[stage], 0.1) << "stage " << stage;
    EXPECT_EQ(memory_lower_bound(m, c, plan).device_model_state_bytes, static_cast<std::int64_t>(exact[stage]));
  }
}

TEST(Lowering, OneUnitWithNoOverlapSumsItsTasks) {
  ModelProfile m = linear_stack(1, 1'000'000);
  const ClusterProfile c = a100(1);
  Plan p = Plan::default_ddp(1, 4);
  const ComputeTime t = unit_compute_time(m, 0, c, 4, "fp32");
  // Adam fp32: read/write params and two states, read grads: P x (2 x (4 + 8) + 4) bytes; 2 tensors.
  const double opt = device_optimizer_time(c, "adam", 1e6, 1e6 * 28, 2, false);
  EXPECT_DOUBLE_EQ(opt, 1e6 * 28 / 2e12 + 10 * 5e-6);
  // The step starts by zeroing the fp32 gradients: a memset at the device's memory bandwidth.
  const double zero = 1e6 * 4 / 2e12 + 5e-6;
  const Prediction pred = simulate(m, c, p);
  EXPECT_DOUBLE_EQ(pred.step_time_s, zero + t.fwd_s + t.bwd_s + opt);
  EXPECT_DOUBLE_EQ(pred.samples_per_s, 4 / pred.step_time_s);
  EXPECT_LE(pred.lower_bound_s, pred.step_time_s);
  EXPECT_EQ(pred.exposed_comm_s, 0.0);
  validate(pred);
}

TEST(Lowering, CommunicationOverlapsTheBackward) {
  const ModelProfile m = gpt(8, 1024, 16, 512, 1000);
  const ClusterProfile c = a100(1);
  Plan p = mixed_plan(8, 0, 4);
  p.buckets.all_reduce_bucket_bytes = 1 << 20;  // one bucket per unit
  const Prediction pred = simulate(m, c, p);
  EXPECT_GT(pred.overlapped_comm_s, 0.0);
  EXPECT_LT(pred.exposed_comm_s, pred.resource_busy_s.at("comm"));
  // Never faster than the compute alone.
  EXPECT_GE(pred.step_time_s, pred.resource_busy_s.at("compute"));
}

// Stage 3 with buckets.prefetch_depth 2 gathers two units ahead: at the peak one more block's gathered
// parameters are resident than at depth 1, and on a slow network (V100, 2 nodes) the step is not slower.
TEST(Prefetch, DepthTwoHoldsOneMoreGatheredUnit) {
  const ModelProfile m = gpt(8, 1024, 16, 512, 1000);
  const ClusterProfile c = resolve_cluster("v100-sxm2-32gb:2");
  auto gathered = [](const Prediction& pred) {
    std::int64_t bytes = 0;
    for (const zeroplan::ResidentItem& r : pred.device.resident)
      if (r.name == "gathered params") bytes += r.bytes;
    return bytes;
  };
  Plan p = mixed_plan(16, 3, 4);
  const Prediction one = simulate(m, c, p);
  p.buckets.prefetch_depth = 2;
  const Prediction two = simulate(m, c, p);
  std::int64_t block = 0;
  for (const UnitProfile& u : m.units) block = std::max(block, u.params);
  const std::int64_t padded = (block + 15) / 16 * 16 * 2;  // fp16, padded to 16 shards
  EXPECT_EQ(gathered(two) - gathered(one), padded) << gathered(one) << " -> " << gathered(two);
  EXPECT_LE(two.step_time_s, one.step_time_s * (1 + 1e-9));
  p.buckets.prefetch = false;  // no prefetch: the depth does nothing
  const Prediction none = simulate(m, c, p);
  p.buckets.prefetch_depth = 1;
  EXPECT_EQ(simulate(m, c, p).device.peak_bytes, none.device.peak_bytes);
}

// Stage 3 in fp32 without clipping (Plan::steps_beside_last_reduce_scatter): one optimizer task per
// reduce-scatter, every landed unit's starting before the last reduce-scatter (the first unit's) ends, the
// last one's after it; with clipping, one task after every reduce-scatter, and the step no shorter.
TEST(Lowering, Stage3StepsLandedUnitsBesideTheLastReduceScatter) {
  const ModelProfile m = gpt(4, 1024, 16, 512, 50000);
  const ClusterProfile c = resolve_cluster("v100-sxm2-32gb:1");
  Plan p = Plan::default_ddp(8, 8);
  p.zero_stage = 3;
  p.reshard_after_forward = true;
  ASSERT_TRUE(p.steps_beside_last_reduce_scatter());
  auto tasks_named = [](const Simulation& s, const std::string& prefix) {
    std::vector<TaskId> out;
    for (TaskId t = 0; t < s.graph.num_tasks(); ++t)
      if (s.graph.label_text(s.graph.tasks()[t].label).rfind(prefix, 0) == 0) out.push_back(t);
    return out;
  };
  const Simulation beside = simulate_step(m, c, p);
  const std::vector<TaskId> steps = tasks_named(beside, "optimizer");
  const std::vector<TaskId> rs = tasks_named(beside, "reduce_scatter");
  ASSERT_EQ(steps.size(), rs.size());
  ASSERT_GE(steps.size(), 3u);
  const double last_rs_end = beside.result.end_s[rs.back()];
  for (std::size_t i = 0; i + 1 < steps.size(); ++i) EXPECT_LT(beside.result.start_s[steps[i]], last_rs_end) << i;
  EXPECT_GE(beside.result.start_s[steps.back()], last_rs_end);
  p.optimizer.max_grad_norm = 1.0;
  ASSERT_FALSE(p.steps_beside_last_reduce_scatter());
  const Simulation after = simulate_step(m, c, p);
  ASSERT_EQ(tasks_named(after, "optimizer").size(), 1u);
  EXPECT_GE(after.result.start_s[tasks_named(after, "optimizer").front()], after.result.end_s[tasks_named(after, "reduce_scatter").back()]);
  EXPECT_LT(beside.prediction.step_time_s, after.prediction.step_time_s);
}

// Calibration factors scale what they name: every compute task, every collective.
TEST(Lowering, CalibrationScalesComputeAndCollectives) {
  const ModelProfile m = gpt(2, 512, 8, 256, 1000);
  ClusterProfile c = a100(1);
  const Plan p = mixed_plan(8, 3, 1);
  const Prediction base = simulate(m, c, p);
  c.calibration = Calibration{2.0, 3.0};
  const Prediction cal = simulate(m, c, p);
  EXPECT_NEAR(cal.resource_busy_s.at("compute"), 2 * base.resource_busy_s.at("compute"), 1e-12);
  EXPECT_NEAR(cal.resource_busy_s.at("comm"), 3 * base.resource_busy_s.at("comm"), 1e-12);
  EXPECT_GT(cal.step_time_s, 2 * base.step_time_s * 0.99);
}

// The probe's core contention on a CPU cluster: the slowdown of ranks computing at once scales every
// compute task of a profile timed one rank alone (as calibration.compute_time_scale would), not one timed
// with the ranks computing at once; compute and collectives then run at their measured contended rates.
TEST(Lowering, CoreContentionOnACpuCluster) {
  ModelProfile m = gpt(2, 256, 4, 64, 1000);
  ClusterProfile one = testing::cpu(1);
  const Plan p1 = Plan::default_ddp(1, 4);
  ClusterProfile scaled = one;
  scaled.calibration.compute_time_scale = 1.5;
  ClusterProfile contended = one;
  contended.core_contention = CoreContention{1.5, 1.25, 2.0};
  EXPECT_DOUBLE_EQ(simulate(m, contended, p1).step_time_s, simulate(m, scaled, p1).step_time_s);
  m.concurrent_ranks = 2;
  EXPECT_DOUBLE_EQ(simulate(m, contended, p1).step_time_s, simulate(m, one, p1).step_time_s);

  ClusterProfile two = testing::cpu(2);
  const Plan p2 = Plan::default_ddp(2, 8);
  auto rates = [&](const ClusterProfile& c) {
    std::map<std::string, double> r;
    const TaskGraph g = lower_step(m, c, p2);
    for (const Resource& x : g.resources()) r[x.name] = x.contended_rate;
    return r;
  };
  EXPECT_EQ(rates(two).at("compute"), 0.0);  // not measured: the cores split evenly
  EXPECT_EQ(rates(two).at("comm"), 0.0);
  two.core_contention = CoreContention{1.0, 1.25, 2.0};
  EXPECT_DOUBLE_EQ(rates(two).at("compute"), 0.8);
  EXPECT_DOUBLE_EQ(rates(two).at("comm"), 0.5);
  EXPECT_EQ(rates(two).at("h2d"), 0.0);
  EXPECT_EQ(rates(a100(1)).at("compute"), 0.0);  // GPUs share no cores
}

// Stages 2-3 add each unit's gradients into a zeroed full buffer: 3 x its bytes through memory (read both,
// write one), or only the zero fill (1 x) when the profile's backward times already include the add.
TEST(Lowering, GradientAddIsNotCountedTwice) {
  ModelProfile m = gpt(2, 256, 4, 64, 1000);
  const ClusterProfile c = testing::cpu(2);
  const Plan p = mixed_plan(2, 2, 1, 2);
  auto acc_s = [&](const ModelProfile& model) {
    const TaskGraph g = lower_step(model, c, p);
    double sum = 0;
    int n = 0;
    for (TaskId t = 0; t < g.num_tasks(); ++t) {
      if (g.task_name(t).rfind("accumulate grads", 0) != 0) continue;
      sum += g.tasks()[t].duration_s;
      ++n;
    }
    EXPECT_GT(n, 0);
    return sum;
  };
  const double before = acc_s(m);
  m.backward_adds_grads = true;
  EXPECT_NEAR(acc_s(m), before / 3, 1e-15);
}

// A tied embedding (the head borrows the embedding's weight): at stages 2-3 the embedding's full
// gradient lives from the head's backward to the embedding's; at stage 3 the embedding stays gathered
// from its forward to its backward. Below stage 2 nothing changes (gradients are resident).
TEST(Lowering, BorrowedParametersHoldTheOwnersGradientAndGatheredWeight) {
  ModelProfile tied = gpt(2, 512, 8, 256, 32000);
  ModelProfile untied = tied;
  tied.units.back().borrowed = {{0, 32000 * 512}};
  const ClusterProfile c = a100(1);
  for (int stage : {0, 1, 2, 3}) {
    Plan p = mixed_plan(8, stage, 1);
    p.reshard_after_forward = stage == 3;
    const Simulation a = simulate_step(tied, c, p), b = simulate_step(untied, c, p);
    if (stage < 2) {
      EXPECT_EQ(a.prediction.device.peak_bytes, b.prediction.device.peak_bytes) << stage;
      continue;
    }
    // At least the embedding's full gradient beyond this rank's share is added at the peak.
    const std::int64_t embed = tied.units.front().params;
    EXPECT_GE(a.prediction.device.peak_bytes - b.prediction.device.peak_bytes, (embed - embed / 8) * 2) << stage;
  }
}

TEST(Lowering, ActivationOffloadWithInfinitelyFastCopiesKeepsTimeAndOnlyTheUnitInFlight) {
  const ModelProfile m = gpt(6, 512, 8, 256, 1000);
  ClusterProfile c = a100(1);
  c.host.bw_h2d_pinned_bytes_per_s = c.host.bw_d2h_pinned_bytes_per_s = 1e300;
  c.links.pcie.latency_s = 0;
  Plan p = mixed_plan(1, 0, 2);
  const Simulation keep = simulate_step(m, c, p);
  p.offload.activations_ratio = 1.0;
  for (bool prefetch : {false, true}) {
    p.offload.activations_prefetch_bytes = prefetch ? -1 : 0;
    const Simulation off = simulate_step(m, c, p);
    EXPECT_DOUBLE_EQ(off.prediction.step_time_s, keep.prediction.step_time_s);
    const auto acts = off.explain.device.by_category[static_cast<int>(MemCategory::activations)];
    std::int64_t largest_saved = 0, largest_workspace = 0, largest_output = 0;
    for (const UnitProfile& u : m.units) {
      largest_saved = std::max(largest_saved, static_cast<std::int64_t>(u.bytes_saved.at(2, 1)));
      largest_output = std::max(largest_output, static_cast<std::int64_t>(u.bytes_output.at(2, 1)));
      largest_workspace = std::max({largest_workspace, static_cast<std::int64_t>(u.bytes_peak_fwd.at(2, 1)),
                                    static_cast<std::int64_t>(u.bytes_peak_bwd.at(2, 1))});
    }
    // A workspace holds at most the unit's input, or its output and that output's gradient, beside
    // its profiled peak; the last unit's output is kept for the loss.
    largest_workspace += 3 * largest_output;
    // Every unit keeps its input (the previous unit's output); beside them, the unit in flight (its saved
    // activations and workspace) and the one before it, let go when this forward ends; in the backward,
    // with prefetch, the next one's.
    const auto units = static_cast<std::int64_t>(m.expanded_unit_count());
    EXPECT_LE(acts, 2 * largest_saved + largest_workspace + units * largest_output) << prefetch;
    EXPECT_LT(off.prediction.device.peak_bytes, keep.prediction.device.peak_bytes);
  }
}

TEST(Lowering, CheckpointingAddsOneForwardPerUnit) {
  const ModelProfile m = gpt(4, 512, 8, 256, 1000);
  const ClusterProfile c = a100(1);
  Plan p = mixed_plan(1, 0, 2);
  const Prediction plain = simulate(m, c, p);
  p.checkpointing.mode = Checkpointing::Mode::all;
  const Prediction ckpt = simulate(m, c, p);
  double fwd = 0;
  for (const UnitTiming& u : plain.units) fwd += u.fwd_s;
  EXPECT_NEAR(ckpt.step_time_s - plain.step_time_s, fwd, 1e-12);
  EXPECT_LT(ckpt.device.peak_bytes, plain.device.peak_bytes);
}

TEST(Lowering, Stage3ExceedsStage2WhenOneUnitOutweighsTheSavings) {
  // One unit holds almost everything: its gathered params and unsharded grads (4P) outweigh what
  // sharding the params saves (2P - 2P/N) on 2 ranks.
  const ModelProfile big = linear_stack(1, 500'000'000);
  const ClusterProfile c = a100(1);
  const auto peak = [&](const ModelProfile& m, int stage) { return simulate(m, c, mixed_plan(2, stage)).device.peak_bytes; };
  EXPECT_GT(peak(big, 3), peak(big, 2));
  // Many small units: stage 3 wins.
  const ModelProfile many = linear_stack(50, 10'000'000);
  EXPECT_LT(peak(many, 3), peak(many, 2));
}

TEST(Lowering, SamePlanTwiceGivesByteIdenticalPredictionAndTrace) {
  const ModelProfile m = gpt(4, 512, 8, 256, 1000);
  const ClusterProfile c = a100(2);
  Plan p = mixed_plan(16, 3, 2, 2);
  p.offload.optimizer = true;
  p.offload.activations_ratio = 0.5;
  const Simulation a = simulate_step(m, c, p);
  const Simulation b = simulate_step(m, c, p);
  EXPECT_EQ(to_json_string(a.prediction), to_json_string(b.prediction));
  EXPECT_EQ(a.trace_json(), b.trace_json());
  EXPECT_EQ(a.explain_text(), b.explain_text());
}

TEST(Lowering, InvalidPlanIsASchemaError) {
  Plan p = mixed_plan(2, 1);
  p.global_batch = 33;
  EXPECT_THROW((void)simulate(gpt(2, 64, 4, 16, 100), a100(1), p), SchemaError);
}

TEST(Lowering, LocalSgdReportsAmortisedAndSyncSteps) {
  const ModelProfile m = gpt(4, 1024, 16, 512, 1000);
  const ClusterProfile c = a100(2);
  Plan p = mixed_plan(16, 0, 2);
  const Prediction ddp = simulate(m, c, p);
  p.localsgd_frequency = 4;
  p.slowmo_frequency = 4;
  p.slowmo_momentum = 0.5;
  const Prediction local = simulate(m, c, p);
  EXPECT_GT(local.sync_step_time_s, local.step_time_s);
  // The ordinary step reduces within the node only.
  EXPECT_LT(local.resource_busy_s.at("comm"), ddp.resource_busy_s.at("comm"));
  EXPECT_EQ(ddp.sync_step_time_s, ddp.step_time_s);
}

// On one node the step already reduced over every rank: LocalSGD averages nothing (fairscale's hierarchy,
// the executor), so no step costs more than another; across two nodes the averaging step does.
TEST(Lowering, LocalSgdOnOneNodeAveragesNothing) {
  const ModelProfile m = gpt(4, 1024, 16, 512, 1000);
  Plan p = mixed_plan(8, 0, 2);
  p.localsgd_frequency = 4;
  const Prediction one = simulate(m, a100(1), p);
  EXPECT_EQ(one.sync_step_time_s, one.step_time_s);
  p.world_size = 16;
  p.global_batch = 32;
  const Prediction two = simulate(m, a100(2), p);
  EXPECT_GT(two.sync_step_time_s, two.step_time_s);
}

TEST(Lowering, OffloadModelRunsSlicesThroughTheDevice) {
  const ModelProfile m = gpt(8, 512, 8, 256, 1000);
  const ClusterProfile c = a100(1);
  Plan p = mixed_plan(1, 0, 4);
  const Prediction plain = simulate(m, c, p);
  p.offload_model = {true, 4, true, 2};
  const Simulation s = simulate_step(m, c, p);
  EXPECT_LT(s.prediction.device.peak_bytes, plain.device.peak_bytes);
  EXPECT_GT(s.prediction.resource_busy_s.at("h2d"), 0.0);
  EXPECT_GT(s.prediction.resource_busy_s.at("host_optimizer"), 0.0);
  EXPECT_GT(s.prediction.host.peak_bytes, 0);
}

TEST(Lowering, GlooReduceScatterTemporaryCountsOnCpu) {
  const ModelProfile m = gpt(2, 256, 4, 64, 1000);
  Plan p = Plan::default_ddp(2, 2);
  p.zero_stage = 3;
  p.reshard_after_forward = true;
  const Simulation s = simulate_step(m, testing::cpu(2), p);
  bool found = false;
  for (const auto& r : s.graph.allocs()) found = found || s.graph.name(r.label.name) == "collective temporary";
  EXPECT_TRUE(found);
  EXPECT_GT(s.prediction.step_time_s, 0);
}

// Tasks of a simulated step named `name`, and its largest allocation labelled `label` (0 if none).
int tasks_named(const Simulation& s, std::string_view name) {
  int n = 0;
  for (const auto& t : s.graph.tasks()) n += s.graph.name(t.label.name) == name;
  return n;
}
std::int64_t largest_alloc_named(const Simulation& s, std::string_view label) {
  std::int64_t most = 0;
  for (const auto& a : s.graph.allocs())
    if (s.graph.name(a.label.name) == label) most = std::max(most, a.bytes);
  return most;
}

// Stage 2 groups units into reduce_buffer_elems buckets as the executor does: one reduce-scatter per
// bucket and microbatch, and a bucket buffer of the bucket's padded size held until it is drained.
TEST(Lowering, Stage2ReduceScattersOneBucketOfReduceBufferElems) {
  const ModelProfile m = linear_stack(8, 1000);  // 8 units of 1000 parameters
  Plan p = Plan::default_ddp(2, 4);
  p.zero_stage = 2;
  p.micro_batch = 1;
  p.microbatches = 2;
  auto count = tasks_named;
  auto bucket_bytes = [](const Simulation& s) { return largest_alloc_named(s, "bucket"); };
  p.buckets.reduce_buffer_elems = 3000;  // units 7-5, 4-2, 1-0
  const Simulation three = simulate_step(m, testing::cpu(2), p);
  EXPECT_EQ(count(three, "reduce_scatter"), 3 * 2);
  EXPECT_EQ(bucket_bytes(three), 3 * 1000 * 4);
  p.buckets.reduce_buffer_elems = 1;  // a reduce-scatter per unit, in place: no bucket buffer
  const Simulation each = simulate_step(m, testing::cpu(2), p);
  EXPECT_EQ(count(each, "reduce_scatter"), 8 * 2);
  EXPECT_EQ(bucket_bytes(each), 0);
  p.buckets.reduce_buffer_elems = 1 << 20;  // the whole model in one bucket
  const Simulation one = simulate_step(m, testing::cpu(2), p);
  EXPECT_EQ(count(one, "reduce_scatter"), 1 * 2);
  EXPECT_EQ(bucket_bytes(one), 8 * 1000 * 4);
  EXPECT_GT(one.prediction.device.peak_bytes, three.prediction.device.peak_bytes);
  EXPECT_EQ(count(one, "wait reduce-scatter"), 2);
}

// Stages 1-2 all-gather the updated parameters as the executor does (allgather_buckets): a unit alone in
// its bucket in place; several units staged in one buffer of the gathered bytes, filled and emptied by
// copies on the compute stream; an fp32 master rounded into each unit's chunk before its in-place gather.
TEST(Lowering, Stage1AllGathersBucketsAsTheExecutor) {
  const ModelProfile m = linear_stack(8, 1000);  // 8 units of 1000 parameters: 500 per rank's chunk
  Plan p = Plan::default_ddp(2, 4);
  p.zero_stage = 1;
  auto count = tasks_named;
  auto staged_bytes = [](const Simulation& s) { return largest_alloc_named(s, "all-gather bucket"); };
  p.buckets.allgather_bucket_bytes = 3 * 1000 * 4;  // {0, 1, 2}, {3, 4, 5}, {6, 7}
  const Simulation three = simulate_step(m, testing::cpu(2), p);
  EXPECT_EQ(count(three, "param sync"), 3);
  EXPECT_EQ(count(three, "cast"), 2 * 3);  // each bucket filled and emptied
  EXPECT_EQ(staged_bytes(three), 2 * 3 * 500 * 4);
  p.buckets.allgather_bucket_bytes = 1;  // one in-place gather per unit: no copies, no buffer
  const Simulation each = simulate_step(m, testing::cpu(2), p);
  EXPECT_EQ(count(each, "param sync"), 8);
  EXPECT_EQ(count(each, "cast"), 0);
  EXPECT_EQ(staged_bytes(each), 0);
  // bf16 beside an fp32 master: the gradients copied to fp32 once, the master rounded into each chunk.
  p.precision.param_dtype = p.precision.compute_dtype = p.precision.reduce_dtype = "bf16";
  const Simulation mixed = simulate_step(m, testing::cpu(2), p);
  EXPECT_EQ(count(mixed, "param sync"), 8);
  EXPECT_EQ(count(mixed, "cast"), 1 + 8);
  EXPECT_GT(mixed.prediction.step_time_s, 0);
}

// ---- random plans: memory monotonicity and the lower bound -----------------------------------------

struct RandomPlans : ::testing::Test {
  std::mt19937 rng{12345};
  ModelProfile model = gpt(6, 512, 8, 128, 2000);
  ClusterProfile cluster = a100(2);
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
  Plan random_plan() {
    const int worlds[] = {2, 8, 16};
    Plan p = mixed_plan(worlds[pick(0, 2)], 0, pick(1, 4), pick(1, 3));
    if (pick(0, 1)) {
      p.precision.param_dtype = p.precision.reduce_dtype = p.precision.compute_dtype = "fp32";
      p.precision.loss_scale.mode = LossScale::Mode::none;
    }
    p.flat_params = pick(0, 1);
    p.buckets.prefetch = pick(0, 1);
    p.buckets.all_reduce_bucket_bytes = std::int64_t{1} << pick(18, 26);
    p.buckets.reduce_buffer_elems = std::int64_t{1} << pick(16, 24);
    p.offload.activations_ratio = pick(0, 1) ? 0.0 : 0.5;
    if (pick(0, 2) == 0) p.checkpointing.mode = Checkpointing::Mode::all;
    return p;
  }
  std::int64_t peak(const Plan& p) { return simulate(model, cluster, p).device.peak_bytes; }
};

TEST_F(RandomPlans, MemoryNeverRisesWithMoreSavingKnobs) {
  for (int trial = 0; trial < 25; ++trial) {
    const Plan base = random_plan();
    SCOPED_TRACE(to_json_string(base));
    std::int64_t prev = peak(base);
    for (int stage = 1; stage <= 2; ++stage) {
      Plan p = base;
      p.zero_stage = stage;
      // Stage 2 saves gradient memory with buckets of a unit (FSDP's SHARD_GRAD_OP); a bucket as large
      // as the model holds a full copy as stage 1 does (Lowering.Stage2ReduceScattersOneBucketOf...).
      if (stage == 2) p.buckets.reduce_buffer_elems = 1;
      const std::int64_t now = peak(p);
      EXPECT_LE(now, prev) << "stage " << stage;
      prev = now;
      p.offload.optimizer = true;
      const std::int64_t off_opt = peak(p);
      EXPECT_LE(off_opt, now) << "offload optimizer at stage " << stage;
      p.offload.grads = true;
      EXPECT_LE(peak(p), off_opt) << "offload grads at stage " << stage;
    }
    Plan s3 = base;
    s3.zero_stage = 3;
    s3.reshard_after_forward = true;
    const std::int64_t s3_peak = peak(s3);
    s3.offload.optimizer = s3.offload.grads = true;
    const std::int64_t s3_off = peak(s3);
    EXPECT_LE(s3_off, s3_peak);
    s3.offload.params = true;
    EXPECT_LE(peak(s3), s3_off);
    for (int stage : {0, 2, 3}) {
      Plan p = base;
      p.zero_stage = stage;
      p.reshard_after_forward = stage == 3;
      p.offload.activations_ratio = 0;
      std::int64_t last = peak(p);
      for (double r : {0.25, 0.5, 1.0}) {
        p.offload.activations_ratio = r;
        const std::int64_t now = peak(p);
        EXPECT_LE(now, last) << "ratio " << r << " stage " << stage;
        last = now;
      }
      p.offload.activations_ratio = base.offload.activations_ratio;
      p.checkpointing.mode = Checkpointing::Mode::none;
      const std::int64_t no_ckpt = peak(p);
      p.checkpointing.mode = Checkpointing::Mode::all;
      const std::int64_t ckpt = peak(p);
      EXPECT_LE(ckpt, no_ckpt) << "checkpointing at stage " << stage;
      p.checkpoint_offload = true;
      EXPECT_LE(peak(p), ckpt) << "checkpoint offload at stage " << stage;
    }
  }
}

TEST_F(RandomPlans, LowerBoundNeverExceedsTheSimulatedPeak) {
  for (int trial = 0; trial < 40; ++trial) {
    Plan p = random_plan();
    p.zero_stage = pick(0, 3);
    p.reshard_after_forward = p.zero_stage == 3 && pick(0, 1);
    if (p.zero_stage >= 1 && pick(0, 1)) p.offload.optimizer = true;
    if (p.offload.optimizer && pick(0, 1)) p.offload.grads = true;
    if (p.zero_stage == 3 && pick(0, 1)) p.offload.params = true;
    if (trial % 5 == 0) {
      p = mixed_plan(1, 0, 4);
      p.offload_model = {true, pick(1, 4), static_cast<bool>(pick(0, 1)), 2};
    }
    SCOPED_TRACE(to_json_string(p));
    const MemoryBound bound = memory_lower_bound(model, cluster, p);
    const Prediction pred = simulate(model, cluster, p);
    EXPECT_LE(bound.device_bytes, pred.device.peak_bytes);
    EXPECT_LE(bound.host_bytes, pred.host.total_bytes());
    EXPECT_GT(bound.device_bytes + bound.host_bytes, 0);
  }
}

}  // namespace
}  // namespace zeroplan::sim
