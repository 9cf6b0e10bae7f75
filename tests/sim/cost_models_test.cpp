// Closed forms first: each expectation is the formula written out, then the model is asked.
#include "zeroplan/sim/cost_models.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "analytic_gpt.h"
#include "zeroplan/profiles/analytic.h"
#include "zeroplan/sim/errors.h"
#include "zeroplan/sim/simulate.h"

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
  c.collectives.push_back({"all_reduce", "nccl", "ring", "intra_node", {8}, 20e-6, 1e-11, 0.01, 0, 1LL << 34, "", {}});
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::all_reduce, 1e9, 8), 20e-6 + 1e-11 * 1e9);
  // Not for another world size or op.
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::all_reduce, 1e9, 4), 2.0 * 3 / 4 * 1e9 / 300e9 + 6 * 5e-6);
}

TEST(Collectives, AFitOfTheReduceDtypeWinsElseTheAnyDtypeFit) {
  ClusterProfile c = cpu(2);
  c.collectives.push_back({"all_reduce", "gloo", "ring", "intra_node", {2}, 1e-4, 1e-9, 0.1, 0, 1 << 24, "", {}});
  c.collectives.push_back({"all_reduce", "gloo", "ring", "intra_node", {2}, 2e-4, 3e-9, 0.1, 0, 1 << 24, "fp16", {}});
  CollectiveOptions fp32, bf16, fp16;
  bf16.dtype = "bf16";
  fp16.dtype = "fp16";
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::all_reduce, 1e6, 2, fp32), 1e-4 + 1e-9 * 1e6);
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::all_reduce, 1e6, 2, fp16), 2e-4 + 3e-9 * 1e6);
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::all_reduce, 1e6, 2, bf16), 1e-4 + 1e-9 * 1e6);  // no bf16 fit
}

TEST(Collectives, MeasuredPointsAreInterpolatedAndExtrapolatedByTheLastSlope) {
  ClusterProfile c = cpu(2);
  // alpha-beta says 1 ms + 1 ns/B; the points say otherwise and win.
  c.collectives.push_back({"all_gather", "gloo", "ring", "intra_node", {2}, 1e-3, 1e-9, 0.1, 1000, 3000, "",
                           {{1000, 1e-4}, {2000, 3e-4}, {3000, 1e-3}}});
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::all_gather, 500, 2), 1e-4);     // below: the smallest's time
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::all_gather, 1500, 2), 2e-4);    // between the first two
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::all_gather, 2500, 2), 6.5e-4);  // between the last two
  EXPECT_DOUBLE_EQ(collective_time(c, CollOp::all_gather, 4000, 2), 1.7e-3);  // beyond: the last slope
}

// zeroplan's Gloo reduce-scatter is a ring: half an all-reduce's traffic, and chunk-sized buffers.
TEST(Collectives, GlooReduceScatterIsARingWithChunkBuffers) {
  const ClusterProfile c = cpu(2);
  const double rs = collective_time(c, CollOp::reduce_scatter, 1e8, 2), ar = collective_time(c, CollOp::all_reduce, 1e8, 2);
  EXPECT_NEAR(rs, ar / 2, ar * 1e-3);  // (N-1)/N against 2(N-1)/N of the bytes; latency terms aside
  EXPECT_EQ(reduce_scatter_temp_bytes(c, 1000, 2), 500);   // the chunk received
  EXPECT_EQ(reduce_scatter_temp_bytes(c, 1000, 4), 500);   // and the running sum sent on
  EXPECT_EQ(reduce_scatter_temp_bytes(c, 1000, 1), 0);
  EXPECT_EQ(reduce_scatter_temp_bytes(a100(1), 1000, 2), 0);
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

// A unit profiled at the plan's dtype too: those times, not the fp32 times over the ratio of GEMM peaks
// (cpu(): bf16 25 GFLOP/s against fp32 50, so 2x the fp32 times without them).
TEST(Compute, TimesMeasuredAtThePlansDtypeReplaceThePeakRatio) {
  ModelProfile m = testing::gpt(1, 64, 4, 16, 100);
  m.measured = true;
  m.device = "cpu";
  m.dtype = "fp32";
  m.units[1].time_fwd_s = Figure::constant(0.01);
  m.units[1].time_bwd_s = Figure::constant(0.02);
  EXPECT_DOUBLE_EQ(unit_compute_time(m, 1, cpu(), 1, "bf16").fwd_s, 0.01 * 50e9 / 25e9);
  m.units[1].times_at_dtype["bf16"] = DtypeTimes{Figure{0.004, Fit{0.001, 0.003, 1, 3}, {}}, Figure::constant(0.007)};
  const ComputeTime t = unit_compute_time(m, 1, cpu(), 1, "bf16");
  EXPECT_TRUE(t.from_profile);
  EXPECT_DOUBLE_EQ(t.fwd_s, 0.004);
  EXPECT_DOUBLE_EQ(t.bwd_s, 0.007);
  EXPECT_DOUBLE_EQ(unit_compute_time(m, 1, cpu(), 4, "bf16").fwd_s, 0.001 + 4 * 0.003);  // the fit elsewhere
  EXPECT_DOUBLE_EQ(unit_compute_time(m, 1, cpu(), 1, "fp32").fwd_s, 0.01);             // the profile's own dtype
  EXPECT_DOUBLE_EQ(unit_compute_time(m, 1, cpu(), 1, "fp16").fwd_s, 0.01 * 50e9 / 10e9);  // not measured: ratio
}

// The probe's slowdown of ranks computing at once applies to profiles timed one rank alone only.
TEST(Compute, RanksSlowdownOnlyForProfilesTimedAlone) {
  ModelProfile m = testing::gpt(1, 64, 4, 16, 100);
  ClusterProfile c = cpu();
  c.calibration.compute_time_scale = 1.1;
  c.core_contention.compute_ranks_slowdown = 1.5;
  EXPECT_DOUBLE_EQ(compute_time_factor(m, c), 1.1 * 1.5);
  m.concurrent_ranks = 2;
  EXPECT_DOUBLE_EQ(compute_time_factor(m, c), 1.1);
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

// ---- compute per op -------------------------------------------------------------------------------

// a100(1) with the per-op model: 108 SMs, 256x128 tiles, a bf16 table, 1.8 TB/s achieved, flash 0.6/0.4.
ClusterProfile a100_ops() {
  ClusterProfile c = a100(1);
  c.device.mem_bw_achieved_bytes_per_s = 1.8e12;
  c.device.gemm.sm_count = 108;
  c.device.gemm.tile_m = 256;
  c.device.gemm.tile_n = 128;
  c.device.gemm.efficiency["bf16"] = {{0, 0, 0, 0.3}, {1024, 1024, 0, 0.6}, {1024, 1024, 1024, 0.8}};
  c.device.attention.fused_fwd_efficiency = 0.6;
  c.device.attention.fused_bwd_efficiency = 0.4;
  return c;
}

TEST(ComputeOps, GemmEfficiencyIsTheLastMatchingBucket) {
  const ClusterProfile c = a100_ops();
  EXPECT_DOUBLE_EQ(gemm_efficiency(c.device, "bf16", 512, 4096, 4096), 0.3);    // m below 1024
  EXPECT_DOUBLE_EQ(gemm_efficiency(c.device, "bf16", 4096, 4096, 512), 0.6);    // k below 1024
  EXPECT_DOUBLE_EQ(gemm_efficiency(c.device, "bf16", 4096, 1024, 1024), 0.8);
  EXPECT_DOUBLE_EQ(gemm_efficiency(c.device, "fp16", 4096, 4096, 4096), 0.5);   // no table: compute_efficiency
}

// The shipped GEMM tables come from published cuBLAS sweeps (profiles/data/microbenchmarks/
// gemm_sweeps.json), not from guesses: each equals fit_gemm_buckets over its sweep (the geometric mean,
// capped at 1, of the efficiency the tile and wave model needs for each published point of a bucket),
// and then predicts every point within 30%.
TEST(GemmTables, ShippedBucketsAreFittedToThePublishedSweeps) {
  std::ifstream in(shipped_data_dir() / "microbenchmarks" / "gemm_sweeps.json");
  ASSERT_TRUE(in) << "no profiles/data/microbenchmarks/gemm_sweeps.json";
  const nlohmann::json doc = nlohmann::json::parse(in);
  ASSERT_EQ(doc.at("schema"), "zeroplan.gemm_sweeps/1");
  int checked = 0;
  for (const auto& sweep : doc.at("sweeps")) {
    EXPECT_EQ(sweep.at("source"), "microbenchmark");
    std::vector<GemmPoint> points;
    for (const auto& pt : sweep.at("points"))
      points.push_back({pt.at("m"), pt.at("n"), pt.at("k"), pt.at("tflops").get<double>() * 1e12});
    for (const auto& name : sweep.at("clusters")) {
      ClusterProfile c = resolve_cluster(name.get<std::string>());
      EXPECT_EQ(c.provenance.at("device.gemm.efficiency").source, "microbenchmark") << name;
      c.calibration = Calibration{};  // the kernels alone, as the sweep ran them (training adds the calibration)
      for (const auto& dtype_json : sweep.at("dtypes")) {
        const std::string dtype = dtype_json.get<std::string>();
        const std::vector<GemmBucket>& table = c.device.gemm.efficiency.at(dtype);
        const std::vector<GemmBucket> fitted = fit_gemm_buckets(c, dtype, table, points);
        ASSERT_EQ(fitted.size(), table.size());
        for (std::size_t b = 0; b < table.size(); ++b)
          EXPECT_NEAR(table[b].efficiency, fitted[b].efficiency, 0.006) << name << " " << dtype << " bucket " << b;
        for (const GemmPoint& p : points) {
          const double published_s = 2 * p.m * p.n * p.k / p.flops_per_s;
          EXPECT_NEAR(gemm_time(c, dtype, p.m, p.n, p.k) / published_s, 1.0, 0.3) << name << " " << dtype << " " << p.m;
          ++checked;
        }
      }
    }
  }
  EXPECT_GE(checked, 3 * 2 * 5);
}

// The fit's closed form: one bucket, two points whose tile-model times at efficiency 1 are 0.5 and 0.8 of
// their measured times give sqrt(0.5 x 0.8); a point above the model's peak caps at 1; a bucket without
// points keeps its value; a non-positive point is refused.
TEST(GemmTables, FitIsTheGeometricMeanOfTheNeededEfficiencies) {
  ClusterProfile c = a100_ops();
  const std::vector<GemmBucket> buckets = {{0, 0, 0, 0.1}, {1024, 1024, 1024, 0.2}, {65536, 65536, 65536, 0.3}};
  c.device.gemm.efficiency["bf16"] = buckets;
  const double peak = 312e12;
  // 8192^3: 32 x 64 tiles of 256 x 128 = 2048 tiles, 19 waves of 108: time at efficiency 1.
  const double t1 = 2 * 19 * 108 * 256 * 128 * 8192.0 / peak;
  const double flops = 2.0 * 8192 * 8192 * 8192;
  const std::vector<GemmPoint> points = {{8192, 8192, 8192, flops / (t1 / 0.5)}, {8192, 8192, 8192, flops / (t1 / 0.8)},
                                         {256, 256, 256, 1e18}};
  const std::vector<GemmBucket> fitted = fit_gemm_buckets(c, "bf16", buckets, points);
  EXPECT_NEAR(fitted[1].efficiency, std::sqrt(0.5 * 0.8), 1e-12);
  EXPECT_EQ(fitted[0].efficiency, 1.0);
  EXPECT_EQ(fitted[2].efficiency, 0.3);
  EXPECT_THROW(fit_gemm_buckets(c, "bf16", buckets, {{0, 1, 1, 1}}), SimError);
  EXPECT_THROW(fit_gemm_buckets(c, "bf16", {}, points), SimError);
}

TEST(ComputeOps, GemmTileAndWaveQuantisation) {
  const ClusterProfile c = a100_ops();
  // 8192 x 4096 x 4096: 32 x 32 = 1024 tiles, ceil(1024 / 108) = 10 waves of 108 tiles.
  const double waves = 10, eff = 0.8, peak = 312e12;
  const double expected = 2 * waves * 108 * 256 * 128 * 4096.0 / (peak * eff);
  EXPECT_DOUBLE_EQ(gemm_time(c, "bf16", 8192, 4096, 4096), expected);
  // One row more costs a whole row of tiles: 33 x 32 = 1056 tiles, still 10 waves: the same time.
  EXPECT_DOUBLE_EQ(gemm_time(c, "bf16", 8193, 4096, 4096), expected);
  // Without the tile model: 2mnk / (peak x efficiency).
  ClusterProfile plain = c;
  plain.device.gemm.sm_count = 0;
  plain.device.gemm.tile_m = plain.device.gemm.tile_n = 0;
  EXPECT_DOUBLE_EQ(gemm_time(plain, "bf16", 8192, 4096, 4096), 2.0 * 8192 * 4096 * 4096 / (peak * eff));
  // Smaller than a tile: the tile shrinks to the matrix rounded up to 16: 100 x 300 -> 112 x 128 tiles,
  // 1 x 3 of them, one wave (k = 4096: bucket 0.3 as m < 1024).
  EXPECT_DOUBLE_EQ(gemm_time(c, "bf16", 100, 300, 4096), 2.0 * 108 * 112 * 128 * 4096 / (peak * 0.3));
  // A batched GEMM: 96 products of 2048 x 2048 x 128 (k small: bucket 0.6): 96 x 8 x 16 tiles.
  const double tiles = 96.0 * 8 * 16, w = std::ceil(tiles / 108);
  EXPECT_DOUBLE_EQ(gemm_time(c, "bf16", 2048, 2048, 128, 96), 2 * w * 108 * 256 * 128 * 128.0 / (peak * 0.6));
}

TEST(ComputeOps, ThinGemmIsBoundByItsBytes) {
  const ClusterProfile c = a100_ops();
  // k = 8: every operand read or written once dominates.
  const double m = 16384, n = 16384, k = 8;
  const double bytes = 2 * (m * k + k * n + m * n);
  const double math = 2 * std::ceil(64.0 * 128 / 108) * 108 * 256 * 128 * k / (312e12 * 0.6);
  ASSERT_GT(bytes / 1.8e12, math);
  EXPECT_DOUBLE_EQ(gemm_time(c, "bf16", m, n, k), bytes / 1.8e12);
}

TEST(ComputeOps, LinearForwardAndBackwardWithBias) {
  const ClusterProfile c = a100_ops();
  UnitOp op;
  op.kind = "gemm";
  op.name = "fc1";
  op.m = 2048;
  op.n = 4096;
  op.k = 1024;
  op.bias = true;
  // Micro batch twice the profile's: m doubles.
  const ComputeParts f = op_time(c, op, 2.0, "bf16", false);
  EXPECT_DOUBLE_EQ(f.gemm_s, gemm_time(c, "bf16", 4096, 4096, 1024));
  EXPECT_EQ(f.kernels, 1);
  EXPECT_DOUBLE_EQ(f.launch_s, 5e-6);
  const ComputeParts b = op_time(c, op, 2.0, "bf16", true);
  EXPECT_DOUBLE_EQ(b.gemm_s, gemm_time(c, "bf16", 4096, 1024, 4096) + gemm_time(c, "bf16", 1024, 4096, 4096));
  EXPECT_DOUBLE_EQ(b.memory_s, 2.0 * 4096 * 4096 / 1.8e12);  // the bias gradient: a column sum of dC
  EXPECT_EQ(b.kernels, 3);
  EXPECT_DOUBLE_EQ(b.total_s(), b.gemm_s + b.memory_s + 3 * 5e-6);
}

TEST(ComputeOps, FlashAttentionCausalHalvesTheWork) {
  const ClusterProfile c = a100_ops();
  UnitOp op;
  op.kind = "attention";
  op.name = "attention";
  op.m = op.n = 2048;
  op.k = 128;
  op.batch = 96;  // micro batch 1 x 96 heads
  op.fused = true;
  op.causal = true;
  const double flops = 4.0 * 96 * 2048 * 2048 * 128 / 2;
  const ComputeParts f = op_time(c, op, 1.0, "bf16", false);
  EXPECT_DOUBLE_EQ(f.attention_s, flops / (312e12 * 0.6));
  EXPECT_EQ(f.kernels, 1);
  const ComputeParts b = op_time(c, op, 1.0, "bf16", true);
  EXPECT_DOUBLE_EQ(b.attention_s, 2.5 * flops / (312e12 * 0.4));
  EXPECT_EQ(b.kernels, 2);
  // Without a flash figure the largest GEMM bucket's efficiency.
  ClusterProfile no_flash = c;
  no_flash.device.attention = {};
  EXPECT_DOUBLE_EQ(op_time(no_flash, op, 1.0, "bf16", false).attention_s, flops / (312e12 * 0.8));
}

TEST(ComputeOps, UnfusedAttentionHasTheScoreSoftmaxAsMemoryBound) {
  const ClusterProfile c = a100_ops();
  UnitOp op;
  op.kind = "attention";
  op.name = "attention";
  op.m = op.n = 1024;
  op.k = 64;
  op.batch = 16;
  op.dropout = true;
  const double scale = 2;  // micro batch 2: 32 products
  const double B = 32, scores = B * 1024 * 1024, e = 2, bw = 1.8e12;
  const double fwd = gemm_time(c, "bf16", 1024, 1024, 64, B) + gemm_time(c, "bf16", 1024, 64, 1024, B) +
                     2 * e * scores / bw + (2 * e + 1) * scores / bw;
  const ComputeParts f = op_time(c, op, scale, "bf16", false);
  EXPECT_DOUBLE_EQ(f.attention_s, fwd);
  EXPECT_EQ(f.kernels, 4);
  const double bwd = gemm_time(c, "bf16", 1024, 64, 1024, B) + gemm_time(c, "bf16", 64, 1024, 1024, B) +
                     gemm_time(c, "bf16", 1024, 1024, 64, B) + gemm_time(c, "bf16", 1024, 64, 1024, B) +
                     3 * e * scores / bw + (2 * e + 1) * scores / bw;
  const ComputeParts b = op_time(c, op, scale, "bf16", true);
  EXPECT_DOUBLE_EQ(b.attention_s, bwd);
  EXPECT_EQ(b.kernels, 6);
  // The softmax alone (no dropout) is a*s^2 elements read and written at the achieved bandwidth.
  op.dropout = false;
  EXPECT_DOUBLE_EQ(op_time(c, op, scale, "bf16", false).attention_s,
                   gemm_time(c, "bf16", 1024, 1024, 64, B) + gemm_time(c, "bf16", 1024, 64, 1024, B) + 2 * e * scores / bw);
}

TEST(ComputeOps, MemoryBoundOpIsBytesOverAchievedBandwidth) {
  ClusterProfile c = a100_ops();
  UnitOp op;
  op.kind = "memory";
  op.name = "dropout1";
  op.elems_fwd = 1e6;
  op.bytes_fwd = 5e5;
  op.kernels_fwd = 1;
  op.elems_bwd = 3e6;
  op.kernels_bwd = 2;
  EXPECT_DOUBLE_EQ(op_time(c, op, 4, "bf16", false).memory_s, 4 * (2 * 1e6 + 5e5) / 1.8e12);
  EXPECT_DOUBLE_EQ(op_time(c, op, 4, "fp32", false).memory_s, 4 * (4 * 1e6 + 5e5) / 1.8e12);
  const ComputeParts b = op_time(c, op, 1, "bf16", true);
  EXPECT_DOUBLE_EQ(b.memory_s, 2 * 3e6 / 1.8e12);
  EXPECT_DOUBLE_EQ(b.launch_s, 2 * 5e-6);
  // No achieved figure: the datasheet bandwidth.
  c.device.mem_bw_achieved_bytes_per_s = 0;
  EXPECT_DOUBLE_EQ(op_time(c, op, 1, "bf16", true).memory_s, 2 * 3e6 / 2e12);
}

TEST(ComputeOps, AUnitWithOpsIsTheirSumMeasuredTimesStillWin) {
  const ClusterProfile c = a100_ops();
  AnalyticGptOptions o = fixtures::gpt_options(2, 1024, 16, 1024, 50257, "bf16");
  o.batch = 2;
  ModelProfile m = analytic_gpt(o);
  const UnitProfile& block = m.units[1];
  ASSERT_FALSE(block.ops.empty());
  ComputeParts f, b;
  for (const UnitOp& op : block.ops) {
    f += op_time(c, op, 4.0 / 2, "bf16", false);
    b += op_time(c, op, 4.0 / 2, "bf16", true);
  }
  const ComputeTime t = unit_compute_time(m, 1, c, 4, "bf16");
  EXPECT_TRUE(t.from_ops);
  EXPECT_FALSE(t.from_profile);
  EXPECT_DOUBLE_EQ(t.fwd_s, f.total_s());
  EXPECT_DOUBLE_EQ(t.bwd_s, b.total_s());
  EXPECT_DOUBLE_EQ(t.fwd_parts.gemm_s, f.gemm_s);
  EXPECT_DOUBLE_EQ(t.bwd_parts.memory_s, b.memory_s);
  EXPECT_EQ(t.fwd_parts.kernels, 4 + 4 + 7);  // 4 GEMMs, unfused attention with dropout, 7 memory-bound
  // A profile measured on a GPU keeps its times, ops or not.
  m.measured = true;
  m.device = "cuda:0";
  m.units[1].time_fwd_s = Figure::proportional(0.01, 2);
  m.units[1].time_bwd_s = Figure::proportional(0.02, 2);
  const ComputeTime measured = unit_compute_time(m, 1, c, 4, "bf16");
  EXPECT_TRUE(measured.from_profile);
  EXPECT_DOUBLE_EQ(measured.fwd_s, 0.02);
  EXPECT_DOUBLE_EQ(measured.bwd_s, 0.04);
}

TEST(ComputeOps, TheStepUsesTheOpsAndSaysSo) {
  const ModelProfile m = analytic_gpt(fixtures::gpt_options(2, 512, 8, 256, 50257, "bf16"));
  Plan p = testing::mixed_plan(8, 3);
  p.precision.param_dtype = p.precision.compute_dtype = p.precision.reduce_dtype = "bf16";
  const Prediction pred = simulate(m, a100_ops(), p);
  bool said = false;
  for (const std::string& note : pred.notes) said = said || note.rfind("compute times summed over each unit's ops", 0) == 0;
  EXPECT_TRUE(said);
  // The first block's forward in the trace is the sum of its ops.
  const ComputeTime t = unit_compute_time(m, 1, a100_ops(), 1, "bf16");
  ASSERT_GT(pred.units.size(), 2u);
  EXPECT_NEAR(pred.units[1].fwd_s, t.fwd_s, 1e-12);
}

TEST(ComputeOps, SubBlockUnitsSplitTheBlockExactly) {
  AnalyticGptOptions o = fixtures::gpt_options(3, 1024, 16, 512, 1000, "bf16");
  o.batch = 2;
  const ModelProfile whole = analytic_gpt(o);
  o.sub_blocks = true;
  const ModelProfile split = analytic_gpt(o);
  ASSERT_EQ(split.units.size(), 2u + 2 * 3);
  EXPECT_EQ(split.units[1].name, "block0.attn");
  EXPECT_EQ(split.units[2].name, "block0.mlp");
  EXPECT_EQ(split.units[6].name, "block2.mlp");
  EXPECT_EQ(split.total_params(), whole.total_params());
  const UnitProfile& block = whole.units[1];
  const UnitProfile& attn = split.units[1];
  const UnitProfile& mlp = split.units[2];
  const double h = 1024;
  EXPECT_EQ(attn.params, 4 * 1024 * 1024 + 6 * 1024);
  EXPECT_EQ(mlp.params, 8 * 1024 * 1024 + 7 * 1024);
  EXPECT_DOUBLE_EQ(attn.bytes_saved.value + mlp.bytes_saved.value, block.bytes_saved.value);
  EXPECT_DOUBLE_EQ(mlp.bytes_saved.value, 512.0 * 2 * h * (10 * 2 + 1));
  EXPECT_DOUBLE_EQ(attn.flops_fwd.value + mlp.flops_fwd.value, block.flops_fwd.value);
  EXPECT_DOUBLE_EQ(attn.flops_bwd.value + mlp.flops_bwd.value, block.flops_bwd.value);
  ASSERT_EQ(attn.ops.size() + mlp.ops.size(), block.ops.size());
  EXPECT_EQ(attn.ops.back().name, "residual1");
  EXPECT_EQ(mlp.ops.front().name, "layernorm2");
  // The halves' times add up to the block's.
  const ClusterProfile c = a100_ops();
  const ComputeTime tb = unit_compute_time(whole, 1, c, 2, "bf16");
  const ComputeTime ta = unit_compute_time(split, 1, c, 2, "bf16"), tm = unit_compute_time(split, 2, c, 2, "bf16");
  EXPECT_NEAR(ta.fwd_s + tm.fwd_s, tb.fwd_s, 1e-15);
  EXPECT_NEAR(ta.bwd_s + tm.bwd_s, tb.bwd_s, 1e-15);
  // At stage 3 the gathered unit is half a block: the device peak falls.
  Plan p = testing::mixed_plan(8, 3, 2);
  p.precision.param_dtype = p.precision.compute_dtype = p.precision.reduce_dtype = "bf16";
  EXPECT_LT(simulate(split, c, p).device.peak_bytes, simulate(whole, c, p).device.peak_bytes);
}

TEST(ComputeOps, AnalyticOptionsAreReadBackFromTheProfile) {
  for (bool sub : {false, true}) {
    for (bool flash : {false, true}) {
      AnalyticGptOptions o = fixtures::gpt_options(3, 256, 4, 128, 1000, "bf16", "round-trip");
      o.batch = 2;
      o.tied_embeddings = !sub;
      o.flash_attention = flash;
      o.sub_blocks = sub;
      const std::optional<AnalyticGptOptions> back = analytic_gpt_options_of(analytic_gpt(o));
      ASSERT_TRUE(back.has_value()) << sub << flash;
      EXPECT_EQ(back->layers, 3);
      EXPECT_EQ(back->hidden, 256);
      EXPECT_EQ(back->heads, 4);
      EXPECT_EQ(back->seq, 128);
      EXPECT_EQ(back->vocab, 1000);
      EXPECT_EQ(back->batch, 2);
      EXPECT_EQ(back->dtype, "bf16");
      EXPECT_EQ(back->tied_embeddings, !sub);
      EXPECT_EQ(back->flash_attention, flash);
      EXPECT_EQ(back->sub_blocks, sub);
    }
  }
  // Not exactly an analytic GPT: an edited figure, or no ops (a profile written before them).
  ModelProfile edited = analytic_gpt(AnalyticGptOptions{});
  edited.units[1].bytes_saved.value *= 1.01;
  EXPECT_FALSE(analytic_gpt_options_of(edited).has_value());
  EXPECT_FALSE(analytic_gpt_options_of(testing::gpt(2, 256, 4, 128)).has_value());
}

TEST(ComputeOps, AnalyticGptOpsCarryTheBlockFlops) {
  // The GEMMs and the (unmasked) attention of a block add up to 24bsh^2 + 4bs^2h, the profile's FLOPs.
  AnalyticGptOptions o = fixtures::gpt_options(12, 768, 12, 512);
  o.batch = 3;
  const ModelProfile m = analytic_gpt(o);
  double flops = 0;
  for (const UnitOp& op : m.units[1].ops) {
    if (op.kind == "gemm") flops += 2.0 * static_cast<double>(op.batch * op.m * op.n * op.k);
    if (op.kind == "attention") flops += 4.0 * static_cast<double>(op.batch * op.m * op.n * op.k);
  }
  EXPECT_DOUBLE_EQ(flops, gpt_layer_flops_fwd(512, 3, 768));
  EXPECT_DOUBLE_EQ(flops, m.units[1].flops_fwd.value);
  // The head's logits GEMM carries its FLOPs too.
  double head = 0;
  for (const UnitOp& op : m.units[2].ops)
    if (op.kind == "gemm") head += 2.0 * static_cast<double>(op.batch * op.m * op.n * op.k);
  EXPECT_DOUBLE_EQ(head, m.units[2].flops_fwd.value);
  // Flash attention keeps no s x s scores: the saved bytes lose 5as^2b and gain the 4asb log-sum-exp.
  AnalyticGptOptions f = o;
  f.flash_attention = true;
  const ModelProfile mf = analytic_gpt(f);
  const double s = 512, b = 3, h = 768, a = 12;
  EXPECT_DOUBLE_EQ(mf.units[1].bytes_saved.value, s * b * h * 34 + 4 * a * s * b);
  EXPECT_DOUBLE_EQ(m.units[1].bytes_saved.value, s * b * h * (34 + 5 * a * s / h));
}

TEST(ComputeOps, LargeGptBlockIsMostlyGemmSmallOneMostlyMemoryAndLaunches) {
  // Shape dependence, not a fit: a GPT-3-sized block spends most of its time in GEMMs; a tiny one
  // (h = 128, s = 64) in memory-bound kernels and launches.
  const ClusterProfile c = a100_ops();
  AnalyticGptOptions big = fixtures::gpt_options(12, 12288, 96, 2048, 50257, "bf16");
  big.flash_attention = true;
  const ComputeTime tb = unit_compute_time(analytic_gpt(big), 1, c, 1, "bf16");
  EXPECT_GT(tb.fwd_parts.gemm_s / tb.fwd_s, 0.7);
  const AnalyticGptOptions tiny = fixtures::gpt_options(12, 128, 2, 64, 50257, "bf16");
  const ComputeTime tt = unit_compute_time(analytic_gpt(tiny), 1, c, 1, "bf16");
  EXPECT_GT((tt.fwd_parts.memory_s + tt.fwd_parts.launch_s) / tt.fwd_s, 0.5);
}

}  // namespace
}  // namespace zeroplan::sim
