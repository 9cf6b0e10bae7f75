// LocalSGD / SlowMo in the lowering (localsgd.cpp, model_states.cpp): the slow buffers' memory, the slow
// update's time, and the warm-up of synchronous steps. Closed forms first.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "fixtures.h"
#include "zeroplan/sim/memory_bound.h"
#include "zeroplan/sim/simulate.h"

namespace zeroplan::sim {
namespace {

using testing::a100;
using testing::gpt;
using testing::mixed_plan;

std::int64_t total_params(const ModelProfile& m) {
  std::int64_t p = 0;
  for (const UnitProfile& u : m.units) p += u.params * u.count;
  return p;
}

Plan localsgd_plan() {
  Plan p = mixed_plan(16, 0, 2);
  p.localsgd_frequency = 4;
  return p;
}

// fairscale SlowMo keeps the slow momentum and the previous parameters, fp32, full size on every rank:
// 8 bytes per parameter of device memory, exactly when its update is not the identity.
TEST(SlowMo, SlowBuffersAreEightBytesPerParameterWhenSlowMoIsOn) {
  const ModelProfile m = gpt(4, 1024, 16, 512, 1000);
  const ClusterProfile c = a100(2);
  const Plan local = localsgd_plan();
  auto states = [&](const Plan& p) { return simulate_step(m, c, p).explain.device.model_state_bytes(); };
  const std::int64_t base = states(local);
  const std::int64_t eight_p = 8 * total_params(m);

  Plan momentum = local;
  momentum.slowmo_frequency = 8;
  momentum.slowmo_momentum = 0.5;
  EXPECT_EQ(states(momentum) - base, eight_p);
  EXPECT_EQ(memory_lower_bound(m, c, momentum).device_model_state_bytes -
                memory_lower_bound(m, c, local).device_model_state_bytes,
            eight_p);

  Plan slow_lr = local;  // slowmo_lr alone also turns the slow update on
  slow_lr.slowmo_frequency = 8;
  slow_lr.slowmo_lr = 0.5;
  EXPECT_EQ(states(slow_lr) - base, eight_p);

  Plan identity = local;  // momentum 0 and slow lr 1: fairscale's slowmo is off, no buffers
  identity.slowmo_frequency = 8;
  EXPECT_EQ(states(identity), base);
  EXPECT_DOUBLE_EQ(simulate(m, c, identity).step_time_s, simulate(m, c, local).step_time_s);
}

// The slow update: five fp32 kernels per parameter tensor, 8 reads and 5 writes of P elements, every
// slowmo_frequency steps; with no launch overhead it adds 52 P / memory bandwidth / slowmo_frequency to
// the amortised step and 52 P / bandwidth to the synchronising one.
TEST(SlowMo, SlowUpdateTimeIsThirteenFp32PassesAmortised) {
  const ModelProfile m = gpt(4, 1024, 16, 512, 1000);
  ClusterProfile c = a100(2);
  c.device.launch_overhead_s = 0;
  const Plan local = localsgd_plan();
  Plan slow = local;
  slow.slowmo_frequency = 8;
  slow.slowmo_momentum = 0.5;
  const Prediction a = simulate(m, c, local), b = simulate(m, c, slow);
  const double update = 52.0 * static_cast<double>(total_params(m)) / c.device.mem_bw_bytes_per_s;
  EXPECT_NEAR(b.step_time_s - a.step_time_s, update / 8, 1e-12);
  EXPECT_NEAR(b.sync_step_time_s - a.sync_step_time_s, update, 1e-12);
}

// Warm-up steps are plain DDP steps, a one-off: the amortised step leaves them out and a note gives their
// time, which is the same plan's without LocalSGD.
TEST(LocalSgd, WarmupStepsAreReportedBesideTheAmortisedStep) {
  const ModelProfile m = gpt(4, 1024, 16, 512, 1000);
  const ClusterProfile c = a100(2);
  Plan p = localsgd_plan();
  p.slowmo_frequency = 8;
  p.slowmo_momentum = 0.5;
  const Prediction steady = simulate(m, c, p);
  p.localsgd_warmup_steps = 100;
  const Prediction warm = simulate(m, c, p);
  EXPECT_DOUBLE_EQ(warm.step_time_s, steady.step_time_s);
  EXPECT_EQ(warm.device.peak_bytes, steady.device.peak_bytes);
  const Prediction ddp = simulate(m, c, mixed_plan(16, 0, 2));
  const std::string want = fmt::format("LocalSGD warm-up: the first 100 steps reduce gradients across all 16 ranks, {:.6f} s each",
                                       ddp.step_time_s);
  bool found = false;
  for (const std::string& n : warm.notes) found = found || n.rfind(want, 0) == 0;
  EXPECT_TRUE(found) << want;
  for (const std::string& n : steady.notes) EXPECT_EQ(n.find("warm-up"), std::string::npos) << n;
}

}  // namespace
}  // namespace zeroplan::sim
