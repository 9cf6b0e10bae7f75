// Off-device memory in the lowering: fairscale OffloadModel (offload_model.cpp) and checkpoint offload
// (activations.cpp). Closed forms first: compute is the sum of the unit tasks the schedule must run.
#include <gtest/gtest.h>

#include <numeric>

#include "fixtures.h"
#include "zeroplan/sim/cost_models.h"
#include "zeroplan/sim/simulate.h"

namespace zeroplan::sim {
namespace {

using testing::a100;
using testing::gpt;
using testing::mixed_plan;

double unit_time_sum(const Prediction& p, bool fwd, bool bwd) {
  double s = 0;
  for (const UnitTiming& u : p.units) s += (fwd ? u.fwd_s : 0) + (bwd ? u.bwd_s : 0);
  return s;
}

// OffloadModel's step starts by zeroing the accumulated gradients on the host (param dtype): a memset
// at the host's memory bandwidth.
double host_zero_s(const ModelProfile& m, const ClusterProfile& c, const Plan& p) {
  double params = 0;
  for (const UnitProfile& u : m.units) params += static_cast<double>(u.params * u.count);
  return params * (p.precision.param_dtype == "fp32" ? 4 : 2) / c.host.memcpy_bw_bytes_per_s + c.device.launch_overhead_s;
}

// Every accumulation microbatch runs through the slices: compute is microbatches x (forward + backward)
// of every unit, the same as without OffloadModel (which runs the optimizer on the device besides).
// The old lowering ran one microbatch: a quarter of this with 4.
TEST(OffloadModel, ComputeCountsEveryAccumulationMicrobatch) {
  const ModelProfile m = gpt(4, 512, 8, 256, 1000);
  const ClusterProfile c = a100(1);
  Plan p = mixed_plan(1, 0, 1, 4);
  const Prediction plain = simulate(m, c, p);
  p.offload_model = {true, 2, false, 1};
  const Prediction om = simulate(m, c, p);
  const double per_microbatch = unit_time_sum(plain, true, true);
  EXPECT_NEAR(unit_time_sum(om, true, true), per_microbatch, 1e-15);
  const double zero = host_zero_s(m, c, p);
  EXPECT_NEAR(om.resource_busy_s.at("compute"), zero + 4 * per_microbatch, 1e-12);
  EXPECT_GE(plain.resource_busy_s.at("compute"), 4 * per_microbatch - 1e-12);  // + the device optimizer step
  EXPECT_GT(om.step_time_s, 4 * per_microbatch);

  // Compute scales with the accumulation microbatches; copies too (each slice visits the device per
  // microbatch, twice), and from the second one on the backward brings the accumulated gradient along.
  Plan one = p;
  one.microbatches = 1;
  one.global_batch = 1;
  const Prediction om1 = simulate(m, c, one);
  EXPECT_NEAR(om.resource_busy_s.at("compute") - zero, 4 * (om1.resource_busy_s.at("compute") - zero), 1e-12);
  EXPECT_GT(om.resource_busy_s.at("h2d"), 4 * om1.resource_busy_s.at("h2d"));
  EXPECT_NEAR(om.resource_busy_s.at("d2h"), 4 * om1.resource_busy_s.at("d2h"), 1e-12);
  EXPECT_NEAR(om.resource_busy_s.at("host_optimizer"), om1.resource_busy_s.at("host_optimizer"), 1e-15);
}

// Inner microbatches split the micro batch inside each slice; checkpoint_activation recomputes every
// slice's forward once per chunk.
TEST(OffloadModel, InnerMicrobatchesAndCheckpointedActivationsInEveryAccumulationMicrobatch) {
  const ModelProfile m = gpt(4, 512, 8, 256, 1000);
  const ClusterProfile c = a100(1);
  Plan p = mixed_plan(1, 0, 2, 3);
  p.offload_model = {true, 3, false, 2};
  const Prediction om = simulate(m, c, p);
  const double chunk = unit_time_sum(om, true, true);  // one chunk of 1 sample through every unit
  const double zero = host_zero_s(m, c, p);
  EXPECT_NEAR(om.resource_busy_s.at("compute"), zero + 3 * 2 * chunk, 1e-12);
  p.offload_model.checkpoint_activation = true;
  const Prediction ckpt = simulate(m, c, p);
  EXPECT_NEAR(ckpt.resource_busy_s.at("compute"), zero + 3 * 2 * (chunk + unit_time_sum(om, true, false)), 1e-12);
}

// The loss keeps the last unit's output (each chunk's) on the device until that chunk's backward.
TEST(OffloadModel, KeepsTheLastUnitsOutputForTheLoss) {
  const ModelProfile m = gpt(2, 256, 4, 128, 5000);
  const ClusterProfile c = a100(1);
  for (bool ckpt : {false, true}) {
    Plan p = mixed_plan(1, 0, 2, 2);
    p.offload_model = {true, 2, ckpt, 2};
    const Simulation s = simulate_step(m, c, p);
    const int last = static_cast<int>(s.prediction.units.size()) - 1;
    // One sample per chunk, fp16 compute as profiled.
    const auto output = static_cast<std::int64_t>(m.units.back().bytes_output.at(1, m.batch));
    int kept = 0;
    for (const auto& a : s.graph.allocs()) {
      if (s.graph.name(a.label.name) != "saved activations" || a.label.unit != last || a.bytes != output) continue;
      ++kept;
      EXPECT_NE(a.free_at, kNone) << "freed by its backward";
    }
    EXPECT_EQ(kept, 2 * 2) << "one per chunk of each accumulation microbatch, checkpoint_activation " << ckpt;
  }
}

// checkpoint_offload, copies free: the step takes as long, the device no longer holds the checkpointed
// inputs of the units behind the one in flight, and the host holds them instead.
TEST(CheckpointOffload, DevicePeakFallsByTheKeptInputsAndTheHostHoldsThem) {
  const ModelProfile m = gpt(6, 512, 8, 256, 1000);
  ClusterProfile c = a100(1);
  c.host.bw_h2d_pinned_bytes_per_s = c.host.bw_d2h_pinned_bytes_per_s = 1e300;
  c.links.pcie.latency_s = 0;
  Plan p = mixed_plan(1, 0, 2);
  // Without an fp32 master: its step's fp32 copy of the gradients (4 bytes per parameter) would put the
  // peak in the optimizer step, after every activation is gone.
  p.precision.master_fp32 = false;
  p.checkpointing.mode = Checkpointing::Mode::all;
  const Prediction kept = simulate(m, c, p);
  p.checkpoint_offload = true;
  const Prediction off = simulate(m, c, p);
  EXPECT_DOUBLE_EQ(off.step_time_s, kept.step_time_s);
  // Kept inputs: unit i keeps unit i-1's output (embed, 6 blocks, head: the blocks' and the head's),
  // and the embedding the model's input (2 x 256 int64 tokens).
  std::vector<std::int64_t> inputs{2 * 256 * 8};
  int prev = -1;
  for (const UnitProfile& u : m.units) {
    for (int r = 0; r < u.count; ++r) {
      if (prev >= 0) inputs.push_back(static_cast<std::int64_t>(m.units[static_cast<std::size_t>(prev)].bytes_output.at(2, 1)));
      prev = static_cast<int>(&u - m.units.data());
    }
  }
  const std::int64_t all = std::accumulate(inputs.begin(), inputs.end(), std::int64_t{0});
  // Both peaks are in the last block's backward: the head's input is freed, the block's own is back on
  // the device; the inputs of the five units before it are on the host.
  EXPECT_DOUBLE_EQ(off.device.at_s, kept.device.at_s);
  const std::int64_t behind = all - inputs[inputs.size() - 1] - inputs[inputs.size() - 2];
  EXPECT_EQ(kept.device.peak_bytes - off.device.peak_bytes, behind);
  EXPECT_EQ(kept.host.peak_bytes, 0);
  EXPECT_GE(off.host.peak_bytes, behind);
  EXPECT_LE(off.host.peak_bytes, all);
}

// Slow copies: every input comes back only when the backward reaches its unit, so the recompute waits
// for each H2D in full; the D2H after each forward overlaps the next forwards as far as it can.
TEST(CheckpointOffload, TimeAddsTheCopiesThatCannotOverlap) {
  const ModelProfile m = gpt(4, 512, 8, 256, 1000);
  ClusterProfile c = a100(1);
  c.host.bw_h2d_pinned_bytes_per_s = c.host.bw_d2h_pinned_bytes_per_s = 1e9;
  Plan p = mixed_plan(1, 0, 2);
  p.checkpointing.mode = Checkpointing::Mode::all;
  const Prediction kept = simulate(m, c, p);
  p.checkpoint_offload = true;
  const Prediction off = simulate(m, c, p);
  // The inputs: the tokens (embed's, 2 x 256 int64), embed's output (block 0's), blocks 0-2's outputs
  // (blocks 1-3's), block 3's (the head's), all 2 x seq x hidden bytes per sample.
  double h2d = copy_time(c, CopyDir::h2d, 2 * 256 * 8), d2h = copy_time(c, CopyDir::d2h, 2 * 256 * 8);
  const double block_in = m.units[0].bytes_output.at(2, 1);
  ASSERT_EQ(block_in, m.units[1].bytes_output.at(2, 1));
  for (int i = 0; i < 5; ++i) {
    h2d += copy_time(c, CopyDir::h2d, block_in);
    d2h += copy_time(c, CopyDir::d2h, block_in);
  }
  EXPECT_NEAR(off.resource_busy_s.at("h2d"), h2d, 1e-12);
  EXPECT_NEAR(off.resource_busy_s.at("d2h"), d2h, 1e-12);
  const double added = off.step_time_s - kept.step_time_s;
  EXPECT_GE(added, h2d - 1e-12);
  EXPECT_LE(added, h2d + d2h + 1e-12);
}

}  // namespace
}  // namespace zeroplan::sim
