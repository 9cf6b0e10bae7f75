// The executor on in-process ranks (threads): the exact micro-case, balance, views, parity of every
// stage against the single-process reference, collective counts per stage, checkpoint RNG.
#include <gtest/gtest.h>

#include "step_test_util.h"
#include "zeroplan/exec/flat_params.h"

namespace zeroplan::exec::testing {
namespace {

Device& cpu_device() {
  static std::unique_ptr<Device> device = make_device("cpu");
  return *device;
}

// ---- a hand-built model for the micro-case and the balance case ----

class LinearUnit : public zoo::UnitModule {
 public:
  LinearUnit() : fc(register_module("fc", torch::nn::Linear(1, 1))) {
    torch::NoGradGuard g;
    fc->weight.fill_(1.0);
    fc->bias.fill_(2.0);
  }
  torch::Tensor forward(const torch::Tensor& x) override { return fc(x); }
  torch::nn::Linear fc;
};

// Sample j is x = j + 1; loss = mean(y * x), so dloss/dy = x as in the PyTorch ZeRO test's y.backward(x).
class MicroTask : public zoo::Task {
 public:
  zoo::Batch batch(std::int64_t, std::int64_t first, std::int64_t count) const override {
    torch::Tensor x = torch::arange(first + 1, first + count + 1, torch::kFloat32).view({count, 1});
    return {x, x.clone()};
  }
  torch::Tensor loss(const torch::Tensor& y, const torch::Tensor& x) const override { return (y * x).mean(); }
  std::vector<std::int64_t> sample_shape() const override { return {1}; }
};

zoo::Model micro_model() {
  zoo::Model m;
  m.name = "micro";
  m.units.push_back({"linear", "Linear", std::make_shared<LinearUnit>(), {}});
  m.task = std::make_unique<MicroTask>();
  return m;
}

TEST(ExecutorMicroCase, TwoRanksSgdGiveExactValues) {
  for (int stage = 0; stage <= 3; ++stage) {
    ThreadHub hub(2);
    std::vector<NamedTensors> params(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        ThreadCommunicator comm(hub, r);
        zoo::Model model = micro_model();
        Plan plan;
        plan.world_size = 2;
        plan.global_batch = 2;
        plan.micro_batch = 1;
        plan.zero_stage = stage;
        plan.optimizer.name = "sgd";
        plan.optimizer.lr = 0.1;
        Recorder rec(r, false);
        Executor ex(model, plan, comm, cpu_device(), rec);
        ex.step(0);
        params[static_cast<std::size_t>(r)] = ex.full_parameters();
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
      const auto& p = params[static_cast<std::size_t>(r)];
      ASSERT_EQ(p.size(), 2u);
      EXPECT_EQ(p[0].first, "linear.fc.weight");
      EXPECT_FLOAT_EQ(p[0].second.item<float>(), 0.75f) << "stage " << stage << " rank " << r;
      EXPECT_FLOAT_EQ(p[1].second.item<float>(), 1.85f) << "stage " << stage << " rank " << r;
    }
  }
}

class ManyTensorsUnit : public zoo::UnitModule {
 public:
  explicit ManyTensorsUnit(int repeat) {
    const std::int64_t sizes[] = {9, 7, 5, 3};
    for (int i = 0; i < repeat; ++i) {
      for (std::int64_t s : sizes) {
        params.push_back(register_parameter("p" + std::to_string(params.size()), torch::randn({s})));
      }
    }
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor acc = x;
    for (auto& p : params) acc = acc + p.sum();
    return acc;
  }
  std::vector<torch::Tensor> params;
};

TEST(ExecutorBalance, Sizes9753RepeatedGiveEveryRank24) {
  for (int world : {2, 3, 4}) {
    ManyTensorsUnit unit(world);
    FlatParams flat(unit.named_parameters().pairs());
    ShardLayout layout = make_shard_layout(flat.numel(), world);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(layout.shard_valid(r), 24) << "world " << world << " rank " << r;
    }
  }
  // And the stage-1 executor steps exactly 24 elements on each of 2 ranks.
  ThreadHub hub(2);
  std::vector<std::int64_t> numel(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ThreadCommunicator comm(hub, r);
      zoo::Model model;
      model.units.push_back({"many", "Test", std::make_shared<ManyTensorsUnit>(2), {}});
      model.task = std::make_unique<MicroTask>();
      Plan plan;
      plan.world_size = 2;
      plan.global_batch = 2;
      plan.micro_batch = 1;
      plan.zero_stage = 1;
      Recorder rec(r, false);
      Executor ex(model, plan, comm, cpu_device(), rec);
      numel[static_cast<std::size_t>(r)] = ex.optimizer_shard_numel();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(numel[0], 24);
  EXPECT_EQ(numel[1], 24);
}

TEST(FlatParams, ViewsShareTheBufferAndSurviveFreeAndRealloc) {
  ManyTensorsUnit unit(1);
  FlatParams flat(unit.named_parameters().pairs());
  ASSERT_EQ(flat.numel(), 24);
  torch::Tensor buf = torch::zeros({25});
  flat.copy_into(buf);
  torch::Tensor before = buf.clone();
  flat.bind(buf);
  EXPECT_TRUE(flat.views_valid(buf));
  EXPECT_TRUE(torch::equal(unit.params[1], before.narrow(0, 9, 7)));
  buf.add_(1.0);  // in place: views see it
  EXPECT_TRUE(torch::equal(unit.params[1], before.narrow(0, 9, 7) + 1));
  free_storage(buf);
  EXPECT_FALSE(storage_allocated(buf));
  realloc_storage(buf);
  buf.copy_(before);
  EXPECT_TRUE(flat.views_valid(buf));
  EXPECT_TRUE(torch::equal(unit.params[3], before.narrow(0, 21, 3)));
  {
    torch::NoGradGuard g;
    unit.params[2].set_data(unit.params[2].detach().clone());  // out of place: no longer a view
  }
  EXPECT_FALSE(flat.views_valid(buf));
}

// ---- parity on threads (the Gloo parity is in gloo_parity_test.cpp) ----

std::vector<PlanSpec> thread_plans() {
  return {
      {0, 1},
      {0, 4, false, false, false, false, true},
      {1, 1},
      {1, 4, false, false, true, true, false},
      {2, 1, false, false, false, false, true},
      {2, 4, false, false, true, true},
      {3, 1, true},
      {3, 4, false},
      {3, 1, true, true, true, true, true},
      {3, 4, true, true, false, false},
  };
}

void check_thread_parity(const ModelSpec& m, const std::vector<PlanSpec>& plans) {
  const int steps = 10;
  TrainResult ref = reference_run(m, make_plan(m, 1, {}), steps);
  for (const PlanSpec& s : plans) {
    const Plan plan = make_plan(m, 2, s);
    auto runs = thread_run(m, plan, steps, cpu_device());
    expect_losses_close(global_losses(runs), ref.losses, m.name + " " + s.label());
    for (const auto& r : runs) {
      expect_params_close(r.params, ref.params, m.name + " " + s.label());
      EXPECT_TRUE(r.views_valid) << s.label();
    }
  }
}

TEST(ExecutorThreadParity, MlpWithOddParameterCount) { check_thread_parity(mlp_odd(), thread_plans()); }
// Every plan of gpt2-tiny runs on real Gloo ranks in gloo_parity_test.cpp; here a quick subset.
TEST(ExecutorThreadParity, Gpt2Tiny) {
  auto plans = thread_plans();
  check_thread_parity(gpt_tiny(), {plans[1], plans[5], plans[8], plans[9]});
}

TEST(ExecutorThreadParity, SgdMomentumAndAdamWWithWeightDecay) {
  for (const char* name : {"sgd", "adamw", "adam"}) {
    ModelSpec m = mlp_odd();
    m.optimizer.name = name;
    m.optimizer.lr = std::string(name) == "sgd" ? 0.05 : 1e-3;
    m.optimizer.momentum = std::string(name) == "sgd" ? 0.9 : 0;
    m.optimizer.weight_decay = 0.01;
    TrainResult ref = reference_run(m, make_plan(m, 1, {}), 10);
    for (const PlanSpec& s : {PlanSpec{0, 1}, PlanSpec{2, 2}, PlanSpec{3, 1, true, true, true, true}}) {
      auto runs = thread_run(m, make_plan(m, 2, s), 10, cpu_device());
      expect_losses_close(global_losses(runs), ref.losses, std::string(name) + " " + s.label());
      expect_params_close(runs[0].params, ref.params, std::string(name) + " " + s.label());
    }
  }
}

// optimizer.max_grad_norm: the global norm over every rank's shard (or its replicated full gradient) and the
// same factor as torch.nn.utils.clip_grad_norm_ in one process, at every stage, microbatches, and with the
// optimizer and gradients on the host; the clipping bites (the unclipped reference ends elsewhere).
TEST(ExecutorThreadParity, GradientClippingEqualsClipGradNorm) {
  ModelSpec m = mlp_odd();
  m.optimizer.max_grad_norm = 0.05;
  TrainResult ref = reference_run(m, make_plan(m, 1, {}), 6);
  ModelSpec unclipped = m;
  unclipped.optimizer.max_grad_norm = 0;
  TrainResult free_run = reference_run(unclipped, make_plan(unclipped, 1, {}), 6);
  EXPECT_GT((ref.params[0].second - free_run.params[0].second).abs().max().item<double>(), 1e-4);
  for (const PlanSpec& s : {PlanSpec{0, 1}, PlanSpec{0, 4}, PlanSpec{1, 1}, PlanSpec{2, 2, false, false, true, true},
                            PlanSpec{3, 1, true, true, true, true}}) {
    auto runs = thread_run(m, make_plan(m, 2, s), 6, cpu_device());
    expect_losses_close(global_losses(runs), ref.losses, "clipped " + s.label());
    for (const auto& r : runs) expect_params_close(r.params, ref.params, "clipped " + s.label());
  }
}

// Stages 1-2's all-gather buckets move bytes only: one gather per unit in place, a mix of in-place and
// staged buckets, and the whole model staged in one give the same parameters bit for bit, in fp32, in
// bf16 beside an fp32 master (rounded into the staging buffer) and with broadcast_fp16 (every bucket
// staged through fp16).
TEST(ExecutorThreadParity, AllGatherBucketsChangeNoArithmetic) {
  const ModelSpec m = gpt_tiny();
  for (int stage : {1, 2}) {
    for (const std::string mode : {"fp32", "bf16", "broadcast_fp16"}) {
      Plan plan = make_plan(m, 2, PlanSpec{stage, 1, false, false, false, false, false, mode == "bf16" ? "bf16" : "fp32"});
      plan.precision.broadcast_fp16 = mode == "broadcast_fp16";
      std::vector<NamedTensors> got;
      for (std::int64_t bytes : {std::int64_t{1}, std::int64_t{200 << 10}, std::int64_t{64 << 20}}) {
        plan.buckets.allgather_bucket_bytes = bytes;
        auto runs = thread_run(m, plan, 3, cpu_device());
        got.push_back(runs[1].params);
      }
      for (std::size_t k = 1; k < got.size(); ++k) {
        ASSERT_EQ(got[k].size(), got[0].size());
        for (std::size_t i = 0; i < got[0].size(); ++i)
          EXPECT_TRUE(torch::equal(got[k][i].second, got[0][i].second))
              << "stage " << stage << " " << mode << " bucket set " << k << " " << got[0][i].first;
      }
    }
  }
}

TEST(ExecutorThreadParity, WorldOfOneEqualsReference) {
  const ModelSpec m = gpt_tiny();
  TrainResult ref = reference_run(m, make_plan(m, 1, {}), 5);
  for (const PlanSpec& s : {PlanSpec{0, 2}, PlanSpec{3, 1, true, true, true, true, true}}) {
    auto runs = thread_run(m, make_plan(m, 1, s), 5, cpu_device());
    expect_losses_close(global_losses(runs), ref.losses, s.label());
    expect_params_close(runs[0].params, ref.params, s.label());
  }
}

// ---- collectives per step against the formulas ----

TEST(ExecutorCounts, CollectivesPerStepMatchFormulas) {
  const ModelSpec m = gpt_tiny();
  for (const PlanSpec& s : {PlanSpec{0, 1}, PlanSpec{0, 4}, PlanSpec{1, 2}, PlanSpec{2, 1}, PlanSpec{2, 4}, PlanSpec{3, 1, true},
                            PlanSpec{3, 4, true}, PlanSpec{3, 2, false}}) {
    Plan plan = make_plan(m, 2, s);
    plan.buckets.all_reduce_bucket_bytes = 200 << 10;  // several buckets
    plan.buckets.reduce_buffer_elems = 60000;          // stage 2: several reduce-scatter buckets
    plan.buckets.allgather_bucket_bytes = 200 << 10;   // stages 1-2: {embed}, {block0}, {block1, head}
    auto runs = thread_run(m, plan, 2, cpu_device());
    zoo::Model model = build(m, plan.seed);
    const std::int64_t f = static_cast<std::int64_t>(model.units.size());  // every gpt unit has parameters
    const std::int64_t mb = s.microbatches;
    // Buckets: units in reverse, closed at the cap.
    // Stage 2 reduce-scatters: the same in elements against reduce_buffer_elems (DeepSpeed's IPG bucket).
    std::int64_t buckets = 0, acc = 0, rs_buckets = 0, rs_acc = 0;
    for (std::int64_t u = f - 1; u >= 0; --u) {
      std::int64_t n = 0;
      for (const auto& p : model.units[static_cast<std::size_t>(u)].module->parameters()) n += p.numel();
      if (s.stage >= 1) n = (n + 1) / 2 * 2;
      acc += n * 4;
      rs_acc += n;
      if (acc >= plan.buckets.all_reduce_bucket_bytes || u == 0) {
        ++buckets;
        acc = 0;
      }
      if (rs_acc >= plan.buckets.reduce_buffer_elems || u == 0) {
        ++rs_buckets;
        rs_acc = 0;
      }
    }
    // Stages 1-2 all-gather the updated parameters in units' order, a bucket closed before the unit that
    // would take it past allgather_bucket_bytes.
    std::int64_t ag_buckets = 0, ag_acc = 0;
    for (std::int64_t u = 0; u < f; ++u) {
      std::int64_t n = 0;
      for (const auto& p : model.units[static_cast<std::size_t>(u)].module->parameters()) n += p.numel();
      const std::int64_t bytes = (n + 1) / 2 * 2 * 4;
      if (ag_buckets == 0 || ag_acc + bytes > plan.buckets.allgather_bucket_bytes) {
        ++ag_buckets;
        ag_acc = 0;
      }
      ag_acc += bytes;
    }
    EXPECT_GT(buckets, 1);
    EXPECT_GT(rs_buckets, 1);
    EXPECT_LT(rs_buckets, f);
    EXPECT_EQ(ag_buckets, 3);
    for (const auto& run : runs) {
      for (const CollectiveCounts& c : run.step_counts) {
        const std::string what = s.label();
        switch (s.stage) {
          case 0:
            EXPECT_EQ(c.all_reduce, buckets) << what;
            EXPECT_EQ(c.all_gather + c.reduce_scatter + c.broadcast, 0) << what;
            break;
          case 1:
            EXPECT_EQ(c.all_reduce, buckets) << what;
            EXPECT_EQ(c.all_gather, ag_buckets) << what;
            EXPECT_EQ(c.reduce_scatter, 0) << what;
            break;
          case 2:
            EXPECT_EQ(c.all_reduce, 0) << what;
            EXPECT_EQ(c.reduce_scatter, mb * rs_buckets) << what;
            EXPECT_EQ(c.all_gather, ag_buckets) << what;
            break;
          case 3:
            // FSDP without no_sync: per microbatch F gathers in forward, F-1 more in backward when
            // resharding (the root stays gathered), F reduce-scatters.
            EXPECT_EQ(c.all_reduce, 0) << what;
            EXPECT_EQ(c.reduce_scatter, mb * f) << what;
            EXPECT_EQ(c.all_gather, mb * (s.reshard ? 2 * f - 1 : f)) << what;
            break;
        }
      }
    }
  }
}

// ---- checkpointing restores the random state: dropout masks match the non-checkpointed run ----

TEST(ExecutorCheckpoint, RecomputeRestoresDropoutMasks) {
  ModelSpec m = gpt_tiny();
  m.options["dropout"] = "0.2";
  auto run = [&](bool ckpt) {
    torch::manual_seed(11);
    return thread_run(m, make_plan(m, 1, PlanSpec{0, 1, false, false, false, false, ckpt}), 4, cpu_device());
  };
  auto plain = run(false);
  auto ckpt = run(true);
  expect_losses_close(ckpt[0].local_losses, plain[0].local_losses, "ckpt vs plain", 0, 0);
  expect_params_close(ckpt[0].params, plain[0].params, "ckpt vs plain", 0, 0);
  auto other = [&] {
    torch::manual_seed(12);
    return thread_run(m, make_plan(m, 1, PlanSpec{0, 1}), 4, cpu_device());
  }();
  EXPECT_NE(other[0].local_losses[0], plain[0].local_losses[0]) << "dropout is not active";
}

// ---- a recompute leaves BatchNorm's running statistics as the forward left them ----

TEST(ExecutorCheckpoint, RecomputesLeaveBatchNormStatisticsAsTheForwardDid) {
  const ModelSpec m = resnet_tiny(4);
  auto run = [&](const std::function<void(Plan&)>& edit) {
    Plan p = make_plan(m, 1, PlanSpec{0, 1});
    edit(p);
    return thread_run(m, p, 2, cpu_device())[0];
  };
  const RankRun plain = run([](Plan&) {});
  ASSERT_FALSE(plain.buffers.empty());
  auto om = [](bool ckpt, int chunks) {
    return [=](Plan& p) {
      p.offload_model.enabled = true;
      p.offload_model.slices = 2;
      p.offload_model.checkpoint_activation = ckpt;
      p.offload_model.microbatches = chunks;
    };
  };
  const std::vector<std::pair<std::string, RankRun>> runs = {
      {"checkpoint all", run([](Plan& p) { p.checkpointing.mode = Checkpointing::Mode::all; })},
      {"OffloadModel", run(om(false, 1))},
      {"OffloadModel checkpoint_activation", run(om(true, 1))},
      {"OffloadModel checkpoint_activation 2 chunks", run(om(true, 2))}};
  const RankRun chunks = run(om(false, 2));  // the statistics of 2 chunks of 2 samples, no recompute
  for (const auto& [what, r] : runs) {
    const RankRun& ref = what.find("2 chunks") != std::string::npos ? chunks : plain;
    ASSERT_EQ(r.buffers.size(), ref.buffers.size()) << what;
    for (std::size_t i = 0; i < r.buffers.size(); ++i) {
      EXPECT_EQ(r.buffers[i].first, ref.buffers[i].first);
      EXPECT_TRUE(torch::equal(r.buffers[i].second, ref.buffers[i].second))
          << what << ": " << r.buffers[i].first << " differs from the run without recompute";
    }
  }
}

// ---- a delay before every collective changes nothing ----

TEST(ExecutorThreadParity, DelayBeforeCollectives) {
  const ModelSpec m = mlp_odd();
  TrainResult ref = reference_run(m, make_plan(m, 1, {}), 5);
  for (const PlanSpec& s : {PlanSpec{2, 2}, PlanSpec{3, 2, true}}) {
    auto runs = thread_run(m, make_plan(m, 2, s), 5, cpu_device(), std::chrono::microseconds(500));
    expect_losses_close(global_losses(runs), ref.losses, s.label());
    expect_params_close(runs[1].params, ref.params, s.label());
  }
}

}  // namespace
}  // namespace zeroplan::exec::testing
