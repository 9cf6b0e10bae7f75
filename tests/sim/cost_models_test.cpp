// Closed forms first: each expectation is the formula written out, then the model is asked.
#include "zeroplan/sim/cost_models.h"

#include <gtest/gtest.h>

#include "fixtures.h"
#include "zeroplan/sim/errors.h"

namespace zeroplan::sim {
namespace {

using testing::a100;
using testing::cpu;

TEST(Collectives, RingAllReduceClosedForm) {
  const double S = 1e9, B = 100e9, alpha = 7e-6;
  for (int n : {2, 3, 8, 64}) {
    const double expected = 2.0 * (n - 1) / n * S / B + 2.0 * (n - 1) * alpha;
    EXPECT_DOUBLE_EQ(collective_time_flat(CollOp::all_reduce, S, n, B, alpha), expected) << n;
  }
}

TEST(Collectives, RingAllGatherAndReduceScatterMoveNMinusOneOverN) {
  const double S = 3e8, B = 50e9, alpha = 3e-6;
  const int n = 8;
  const double expected = 7.0 / 8.0 * S / B + 7 * alpha;
  EXPECT_DOUBLE_EQ(collective_time_flat(CollOp::all_gather, S, n, B, alpha), expected);
  EXPECT_DOUBLE_EQ(collective_time_flat(CollOp::reduce_scatter, S, n, B, alpha), expected);
  EXPECT_DOUBLE_EQ(collective_time_flat(CollOp::broadcast, S, n, B, alpha), S / B + 7 * alpha);
}

TEST(Collectives, TreeHasLogLatencyAndBestPicksTheFaster) {
  const double B = 100e9, alpha = 10e-6;
  const int n = 64;
  EXPECT_DOUBLE_EQ(collective_time_flat(CollOp::all_reduce, 8, n, B, alpha, CollAlgo::tree), 2 * 8 / B + 2 * 6 * alpha);
  // Small message: tree wins; large: ring wins.
  EXPECT_DOUBLE_EQ(collective_time_flat(CollOp::all_reduce, 8, n, B, alpha, CollAlgo::best),
                   collective_time_flat(CollOp::all_reduce, 8, n, B, alpha, CollAlgo::tree));
  EXPECT_DOUBLE_EQ(collective_time_flat(CollOp::all_reduce, 1e10, n, B, alpha, CollAlgo::best),
                   collective_time_flat(CollOp::all_reduce, 1e10, n, B, alpha, CollAlgo::ring));
}

TEST(Collectives, BusBandwidthFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::all_reduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::all_gather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::reduce_scatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::broadcast, 4), 1.0);
  // busbw of the ring all-reduce equals the link bandwidth when latency is zero.
  const double S = 1e9, B = 100e9;
  const double t = collective_time_flat(CollOp::all_reduce, S, 8, B, 0);
  EXPECT_DOUBLE_EQ(S / t * bus_factor(CollOp::all_reduce, 8), B);
}

TEST(Collectives, WithinANodeUsesTheIntraNodeLink) {
  const ClusterProfile c = a100(1);
  const double S = 1e9;
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::all_reduce, S, 8),
                   2.0 * 7 / 8 * S / 300e9 + 2.0 * 7 * 5e-6);
  EXPECT_EQ(collective_time(c, CollOp::all_reduce, S, 1), 0.0);
}

TEST(Collectives, AcrossNodesIsHierarchical) {
  const ClusterProfile c = a100(4);
  const double S = 1e9;
  const double intra_rs = 7.0 / 8 * S / 300e9 + 7 * 5e-6;
  const double inter_ar = 2.0 * 3 / 4 * S / 200e9 + 2.0 * 3 * 10e-6;
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::all_reduce, S, 32), intra_rs + inter_ar + intra_rs);
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::all_gather, S, 32), 3.0 / 4 * S / 200e9 + 3 * 10e-6 + intra_rs);
}

TEST(Collectives, AFittedAlphaBetaWins) {
  ClusterProfile c = a100(1);
  c.collectives.push_back({"all_reduce", "nccl", "ring", "intra_node", {8}, 20e-6, 1e-11, 0.01, 0, 1LL << 34});
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::all_reduce, 1e9, 8), 20e-6 + 1e-11 * 1e9);
  // Not for another world size or op.
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::all_reduce, 1e9, 4), 2.0 * 3 / 4 * 1e9 / 300e9 + 6 * 5e-6);
}

TEST(Collectives, GlooReduceScatterIsAnAllReducePlusAFullTemporary) {
  const ClusterProfile c = cpu(2);
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::reduce_scatter, 1e8, 2), collective_time(c, CollOp::all_reduce, 1e8, 2));
  EXPECT_EQ(reduce_scatter_temp_bytes(c, 1000), 1000);
  EXPECT_EQ(reduce_scatter_temp_bytes(a100(1), 1000), 0);
}

TEST(Copies, PinnedAndPageableEachWay) {
  const ClusterProfile c = a100(1);
  EXPECT_DOUBLE_EQ(copy_time(c, CopyDir::h2d, 1e9, true), 1e9 / 25e9 + 1e-6);
  EXPECT_DOUBLE_EQ(copy_time(c, CopyDir::h2d, 1e9, false), 1e9 / 10e9 + 1e-6);
  EXPECT_DOUBLE_EQ(copy_time(c, CopyDir::d2h, 1e9, true), 1e9 / 24e9 + 1e-6);
  EXPECT_DOUBLE_EQ(copy_time(c, CopyDir::d2h, 1e9, false), 1e9 / 9e9 + 1e-6);
}

TEST(Optimizer, HostParamsPerSecondFlatOrPerTensor) {
  const ClusterProfile c = a100(1);
  EXPECT_DOUBLE_EQ(host_optimizer_time(c, "adam", 1e9, false), 1.0);
  EXPECT_DOUBLE_EQ(host_optimizer_time(c, "adamw", 1e9, true), 0.5);
  EXPECT_DOUBLE_EQ(host_optimizer_time(c, "sgd", 1e9, true), 0.25);
}

TEST(Optimizer, DeviceStepIsMemoryBoundPlusLaunchesFlatSavesThem) {
  const ClusterProfile c = a100(1);
  const double per_tensor = device_optimizer_time(c, "adam", 1e6, 2e7, 100, false);
  const double flat = device_optimizer_time(c, "adam", 1e6, 2e7, 100, true);
  EXPECT_DOUBLE_EQ(per_tensor, 2e7 / 2e12 + 5 * 100 * 5e-6);
  EXPECT_DOUBLE_EQ(flat, 2e7 / 2e12 + 5e-6);  // one fused kernel over the flat buffer
}

TEST(Compute, RooflineOfFlopsWithEfficiencyAndLaunches) {
  const ModelProfile m = testing::gpt(2, 1024, 16, 512, 1000);
  const ClusterProfile c = a100(1);
  const UnitProfile& b = m.units[1];
  const double flops = 24.0 * 512 * 1024 * 1024 + 4.0 * 512 * 512 * 1024;  // per sample
  const ComputeTime t = unit_compute_time(m, 1, c, 4, "fp16");
  EXPECT_FALSE(t.from_profile);
  const double compute = 4 * flops / (312e12 * 0.5);
  const double bytes = static_cast<double>(b.params) * 2 + 4 * (2.0 * 512 * 1024 + 512 * 1024 * (34 + 5.0 * 16 * 512 / 1024));
  ASSERT_GT(compute, bytes / 2e12);  // compute bound at this size
  EXPECT_DOUBLE_EQ(t.fwd_s, compute + 12 * 5e-6);
  EXPECT_DOUBLE_EQ(t.bwd_s, 2 * compute + 24 * 5e-6);
}

TEST(Compute, MeasuredTimesOnTheSameDeviceKindAreUsed) {
  ModelProfile m = testing::gpt(1, 64, 4, 16, 100);
  m.measured = true;
  m.device = "cpu";
  m.dtype = "fp32";
  m.units[1].time_fwd_s = Figure{0.01, Fit{0.002, 0.004, 1, 3}, {}};
  m.units[1].time_bwd_s = Figure::constant(0.02);
  const ComputeTime t = unit_compute_time(m, 1, cpu(), 1, "fp32");
  EXPECT_TRUE(t.from_profile);
  EXPECT_DOUBLE_EQ(t.fwd_s, 0.01);                             // the reference batch: the measured value
  EXPECT_DOUBLE_EQ(unit_compute_time(m, 1, cpu(), 4, "fp32").fwd_s, 0.002 + 4 * 0.004);  // elsewhere: the fit
  EXPECT_DOUBLE_EQ(t.bwd_s, 0.02);
  EXPECT_FALSE(unit_compute_time(m, 1, a100(1), 1, "fp32").from_profile);  // measured on cpu, target cuda
}

TEST(Compute, AnEmbeddingWithoutFlopsIsTimedByTheBytesItMoves) {
  ModelProfile m = testing::gpt(1, 64, 4, 16, 100);
  UnitProfile& e = m.units[0];
  e.type = "Embedding";
  e.flops_fwd = Figure::constant(0);
  e.flops_bwd = Figure::constant(0);
  e.time_fwd_s = Figure::constant(0);
  e.time_bwd_s = Figure::constant(0);
  const auto c = a100(1);
  const double bytes = double(e.params) * 2 + e.bytes_output.at(1, m.batch) + e.bytes_saved.at(1, m.batch);
  ComputeTime t = unit_compute_time(m, 0, c, 1, "fp16");
  EXPECT_GT(t.fwd_s, 0);
  EXPECT_NEAR(t.fwd_s, bytes / c.device.mem_bw_bytes_per_s + 2 * c.device.launch_overhead_s, 1e-12);
}

TEST(Compute, NoTimeAndNoFlopsIsAClearError) {
  ModelProfile m = testing::gpt(1, 64, 4, 16, 100);
  m.units[1].flops_fwd = Figure::constant(0);
  m.units[1].flops_bwd = Figure::constant(0);
  try {
    (void)unit_compute_time(m, 1, a100(1), 1, "fp16");
    FAIL();
  } catch (const SimError& e) {
    EXPECT_STREQ(e.what(), "simulate: unit 1 \"block\" has no time and no flops");
  }
}

}  // namespace
}  // namespace zeroplan::sim
