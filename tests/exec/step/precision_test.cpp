// Mixed precision on in-process ranks: the loss scaler's rules (GradScaler's), a step with an inf
// injected into one rank's gradient shard skipped on every rank (none, some and all ranks overflowing),
// collective bytes of broadcast_fp16 and fp32_reduce_scatter, 16-bit parity of 2 ranks against 1.
#include <gtest/gtest.h>

#include <limits>

#include "step_test_util.h"
#include "zeroplan/exec/loss_scaler.h"

namespace zeroplan::exec::testing {
namespace {

Device& precision_test_device() {
  static std::unique_ptr<Device> device = make_device("cpu");
  return *device;
}

Plan mixed(Plan p, const std::string& dtype, bool dynamic_scale) {
  p.precision.param_dtype = p.precision.compute_dtype = p.precision.reduce_dtype = dtype;
  if (dynamic_scale) p.precision.loss_scale.mode = LossScale::Mode::dynamic;
  return p;
}

TEST(LossScaler, DynamicGrowsAfterIntervalAndBacksOffOnInf) {
  LossScale cfg;
  cfg.mode = LossScale::Mode::dynamic;
  LossScalerOptions o;
  o.growth_interval = 3;
  LossScaler s(cfg, torch::kCPU, o);
  EXPECT_EQ(s.scale(), 65536.0);
  torch::Tensor g = torch::full({4}, 0.5 * 65536, torch::kFloat16);  // fp16 holds up to 65504
  EXPECT_FALSE(s.unscale_and_check({g}, nullptr));
  EXPECT_TRUE(torch::equal(g, torch::full({4}, 0.5, torch::kFloat16)));
  for (int i = 0; i < 3; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 131072.0);
  EXPECT_EQ(s.clean_steps(), 0);
  s.update(false);
  torch::Tensor bad = torch::tensor({1.0f, std::numeric_limits<float>::infinity()});
  EXPECT_TRUE(s.unscale_and_check({g, bad}, nullptr));
  s.update(true);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.clean_steps(), 0);
  torch::Tensor nan = torch::tensor({std::numeric_limits<float>::quiet_NaN()});
  EXPECT_TRUE(s.unscale_and_check({nan}, nullptr));
}

TEST(LossScaler, FixedUnscalesAndNeverSkipsNoneTouchesNothing) {
  LossScale fixed;
  fixed.mode = LossScale::Mode::fixed;
  fixed.value = 128;
  LossScaler s(fixed, torch::kCPU);
  torch::Tensor g = torch::tensor({256.0f, std::numeric_limits<float>::infinity()});
  EXPECT_FALSE(s.unscale_and_check({g}, nullptr));
  EXPECT_EQ(g[0].item<float>(), 2.0f);
  s.update(true);
  EXPECT_EQ(s.scale(), 128.0);
  LossScaler none(LossScale{}, torch::kCPU);
  torch::Tensor h = torch::tensor({3.0f});
  EXPECT_FALSE(none.unscale_and_check({h}, nullptr));
  EXPECT_EQ(h.item<float>(), 3.0f);
  EXPECT_EQ(none.scale(), 1.0);
}

// Writes inf into this rank's result of the next gradient collective once armed: a reduce-scatter's
// output (its gradient shard) or a whole all-reduced bucket. One-element all-reduces (the ranks' overflow
// agreement) pass untouched.
class InfInjector final : public Communicator {
 public:
  explicit InfInjector(Communicator& inner) : inner_(inner) {}
  void arm() { armed_ = true; }
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  std::string backend() const override { return inner_.backend(); }
  std::unique_ptr<Work> all_reduce(torch::Tensor& t, ReduceOp op) override {
    auto w = inner_.all_reduce(t, op);
    if (armed_ && t.numel() > 1) inject(*w, t);
    return w;
  }
  std::unique_ptr<Work> all_gather(torch::Tensor& out, const torch::Tensor& in) override { return inner_.all_gather(out, in); }
  std::unique_ptr<Work> reduce_scatter(torch::Tensor& out, const torch::Tensor& in, ReduceOp op) override {
    auto w = inner_.reduce_scatter(out, in, op);
    if (armed_) inject(*w, out.view({-1}).narrow(0, 0, 1));
    return w;
  }
  std::unique_ptr<Work> broadcast(torch::Tensor& t, int root) override { return inner_.broadcast(t, root); }
  void barrier() override { inner_.barrier(); }
  std::vector<std::string> fallbacks() const override { return {}; }

 private:
  void inject(Work& w, torch::Tensor t) {
    w.wait();
    torch::NoGradGuard g;
    t.fill_(std::numeric_limits<float>::infinity());
    armed_ = false;
  }
  Communicator& inner_;
  bool armed_ = false;
};

struct OverflowRun {
  std::vector<StepStats> stats;         // per step
  std::vector<NamedTensors> params;     // after each step
};

// 2 ranks, steps at the given batch indices; `inject[s][r]`: rank r overflows at step s.
std::vector<OverflowRun> overflow_run(const Plan& plan, const std::vector<int>& batches,
                                      const std::vector<std::vector<bool>>& inject, int growth_interval) {
  ThreadHub hub(2);
  std::vector<OverflowRun> runs(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        ThreadCommunicator inner(hub, r);
        InfInjector comm(inner);
        zoo::Model model = build(mlp_odd(), plan.seed);
        Recorder rec(r, false);
        Executor ex(model, plan, comm, precision_test_device(), rec);
        ex.loss_scaler().set_growth_interval(growth_interval);
        for (std::size_t s = 0; s < batches.size(); ++s) {
          if (s < inject.size() && inject[s][static_cast<std::size_t>(r)]) comm.arm();
          runs[static_cast<std::size_t>(r)].stats.push_back(ex.step(batches[s]));
          runs[static_cast<std::size_t>(r)].params.push_back(ex.full_parameters());
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
  return runs;
}

bool bitwise_equal(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i].second, b[i].second)) return false;
  }
  return true;
}

// Every stage; no rank, one rank, both ranks overflowing at step 1 of 3. An overflow skips the step on
// both ranks, halves the scale and leaves the parameters bitwise unchanged; the next step then equals
// a run in which the skipped step never happened (the optimizer state was not touched either).
TEST(ExecutorLossScale, OverflowSkipsOnEveryRankNoneSomeAll) {
  for (int stage = 0; stage <= 3; ++stage) {
    Plan plan = mixed(make_plan(mlp_odd(), 2, {stage, 1, stage == 3}), "fp16", true);
    const auto clean = overflow_run(plan, {0, 1}, {}, 2000);
    for (const auto& [name, inject] : std::vector<std::pair<std::string, std::vector<bool>>>{
             {"none", {false, false}}, {"some", {false, true}}, {"all", {true, true}}}) {
      const std::string what = "stage " + std::to_string(stage) + " overflow " + name;
      const bool overflow = inject[0] || inject[1];
      const auto runs = overflow_run(plan, {0, 1, 1}, {{false, false}, inject}, 2000);
      for (int r = 0; r < 2; ++r) {
        const OverflowRun& run = runs[static_cast<std::size_t>(r)];
        ASSERT_EQ(run.stats.size(), 3u) << what;
        EXPECT_FALSE(run.stats[0].skipped) << what;
        EXPECT_EQ(run.stats[1].skipped, overflow) << what << " rank " << r;
        EXPECT_FALSE(run.stats[2].skipped) << what;
        EXPECT_EQ(run.stats[1].loss_scale, 65536.0) << what;
        EXPECT_EQ(run.stats[2].loss_scale, overflow ? 32768.0 : 65536.0) << what << " rank " << r;
        EXPECT_EQ(bitwise_equal(run.params[1], run.params[0]), overflow) << what << " rank " << r;
        if (overflow) {
          // Steps 0 and 1 of a clean run: the skipped step left parameters and optimizer state alone.
          expect_params_close(run.params[2], clean[static_cast<std::size_t>(r)].params[1], what + " after skip");
        }
      }
    }
  }
}

TEST(ExecutorLossScale, ScaleGrowsAfterCleanSteps) {
  Plan plan = mixed(make_plan(mlp_odd(), 2, {2, 1}), "fp16", true);
  const auto runs = overflow_run(plan, {0, 1, 2, 3, 4}, {{false, false}, {false, false}, {false, false}, {true, false}}, 2);
  const std::vector<double> want = {65536, 65536, 131072, 131072, 65536};
  for (int r = 0; r < 2; ++r) {
    for (std::size_t s = 0; s < want.size(); ++s) {
      EXPECT_EQ(runs[static_cast<std::size_t>(r)].stats[s].loss_scale, want[s]) << "rank " << r << " step " << s;
    }
    EXPECT_TRUE(runs[static_cast<std::size_t>(r)].stats[3].skipped);
  }
}

CollectiveCounts one_step_counts(const Plan& plan) {
  auto runs = thread_run(mlp_odd(), plan, 1, precision_test_device());
  return runs[0].step_counts.at(0);
}

// As the simulator predicts (sim/src/lowering/optimizer_step.cpp, dp_sync.cpp): broadcast_fp16 halves the
// stage 1-2 all-gather of fp32 parameters; fp32_reduce_scatter doubles a 16-bit reduce-scatter.
TEST(ExecutorPrecisionComm, Broadcast16HalvesAllGatherFp32ReduceScatterDoubles) {
  for (int stage : {1, 2}) {
    Plan plan = make_plan(mlp_odd(), 2, {stage, 1});
    Plan b16 = plan;
    b16.precision.broadcast_fp16 = true;
    const CollectiveCounts full = one_step_counts(plan), half = one_step_counts(b16);
    EXPECT_GT(full.bytes_all_gather, 0);
    EXPECT_EQ(half.bytes_all_gather * 2, full.bytes_all_gather) << "stage " << stage;
    EXPECT_EQ(half.bytes_all_reduce + half.bytes_reduce_scatter, full.bytes_all_reduce + full.bytes_reduce_scatter);
  }
  for (int stage : {2, 3}) {
    Plan bf16 = mixed(make_plan(mlp_odd(), 2, {stage, 1, stage == 3}), "bf16", false);
    Plan fp32rs = bf16;
    fp32rs.precision.reduce_dtype = "fp32";
    fp32rs.precision.fp32_reduce_scatter = true;
    const CollectiveCounts a = one_step_counts(bf16), b = one_step_counts(fp32rs);
    EXPECT_GT(a.bytes_reduce_scatter, 0);
    EXPECT_EQ(a.bytes_reduce_scatter * 2, b.bytes_reduce_scatter) << "stage " << stage;
    EXPECT_EQ(a.bytes_all_gather, b.bytes_all_gather) << "stage " << stage;
  }
}

// 2 in-process ranks against 1 with the same 16-bit plan, every stage (the Gloo variant is in
// gloo_parity_test.cpp): bf16 rtol 1.6e-2, fp16 1e-3 (PyTorch's tolerances for the dtypes).
TEST(ExecutorPrecisionParity, TwoRanksMatchOneBf16Fp16EveryStage) {
  const ModelSpec m = gpt_tiny();
  for (const auto& [dtype, rtol] : std::vector<std::pair<std::string, double>>{{"bf16", 1.6e-2}, {"fp16", 1e-3}}) {
    const bool scaled = dtype == "fp16";
    const auto ref = thread_run(m, mixed(make_plan(m, 1, {0, 1}), dtype, scaled), 5, precision_test_device());
    for (int stage = 0; stage <= 3; ++stage) {
      const Plan plan = mixed(make_plan(m, 2, {stage, 1, stage == 3}), dtype, scaled);
      const auto runs = thread_run(m, plan, 5, precision_test_device());
      const std::string what = dtype + " stage " + std::to_string(stage);
      expect_losses_close(global_losses(runs), ref[0].local_losses, what, rtol, rtol);
      expect_params_close(runs[0].params, ref[0].params, what, rtol, rtol);
    }
  }
}

// What the executor does not run with 16-bit parameters or loss scaling is refused at construction with
// one line naming the knobs (the CLI's tests/cli/errors.sh checks the exit code).
TEST(ExecutorPrecisionRefusals, LocalSgdWith16BitParamsAndAdaScaleWithLossScale) {
  auto refusal = [](const Plan& plan) -> std::string {
    ThreadHub hub(1);
    ThreadCommunicator comm(hub, 0);
    zoo::Model model = build(mlp_odd(), plan.seed);
    Recorder rec(0, false);
    try {
      Executor ex(model, plan, comm, precision_test_device(), rec);
    } catch (const ExecError& e) {
      return e.what();
    }
    return "(not refused)";
  };
  for (const std::string dtype : {"bf16", "fp16"}) {
    Plan local = mixed(make_plan(mlp_odd(), 1, {0, 1}), dtype, dtype == "fp16");
    local.localsgd_frequency = 2;
    EXPECT_EQ(refusal(local), "precision.param_dtype " + dtype +
                                  " with localsgd_frequency 2: the executor runs LocalSGD and SlowMo with fp32 "
                                  "parameters only");
  }
  for (const auto mode : {LossScale::Mode::dynamic, LossScale::Mode::fixed}) {
    Plan ada = make_plan(mlp_odd(), 1, {0, 1});
    ada.precision.compute_dtype = "fp16";
    ada.precision.loss_scale.mode = mode;
    if (mode == LossScale::Mode::fixed) ada.precision.loss_scale.value = 1024;
    ada.optimizer.name = "sgd";
    ada.adascale = true;
    EXPECT_EQ(refusal(ada), "adascale with precision.loss_scale: the executor runs AdaScale without loss scaling only");
  }
  // fp32 parameters with LocalSGD and AdaScale without loss scaling run.
  Plan local32 = make_plan(mlp_odd(), 1, {0, 1});
  local32.localsgd_frequency = 2;
  EXPECT_EQ(refusal(local32), "(not refused)");
}

}  // namespace
}  // namespace zeroplan::exec::testing
