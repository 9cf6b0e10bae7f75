// Shared by the executor tests: plans, the single-process reference (plain libtorch + torch::optim,
// no executor), in-process multi-rank runs over ThreadCommunicator, and comparisons.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "thread_comm.h"
#include "zeroplan/exec/counting_communicator.h"
#include "zeroplan/exec/device.h"
#include "zeroplan/exec/executor.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/profiles/zoo.h"

namespace zeroplan::exec::testing {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct ModelSpec {
  std::string name;
  std::string preset;
  zoo::Options options;
  int global_batch = 8;
  Optimizer optimizer;  // the plan's optimizer (default: Adam, lr 1e-3)
  // > 0: the reference accumulates over micro batches of this size (BatchNorm normalises per micro
  // batch, so only a reference with the ranks' micro batch computes the same function).
  int reference_micro_batch = 0;
};

// Adam's eps is 1e-6 for gpt: the attention key bias has a gradient that is zero in exact arithmetic
// (softmax ignores a constant added to every key), so its computed gradient is rounding noise of
// ~1e-10 that Adam with eps 1e-8 normalises into +-lr steps whose signs depend on the reduction order.
// No reduction order is "right"; with eps 1e-6 that noise moves parameters by ~1e-9, below atol.
inline ModelSpec gpt_tiny() {
  ModelSpec m{"gpt", "gpt2-tiny", {}, 8, {}};
  m.optimizer.eps = 1e-6;
  return m;
}
// resnet18 layout, width 8, 64 x 64 images, 10 classes: convolutions, BatchNorm, pooling. SGD with
// momentum: BatchNorm removes any per-channel constant from the conv before it, so part of that conv's
// weight gradient is zero in exact arithmetic and rounding noise in practice, which Adam (like gpt's key
// bias, above) would normalise into full steps whose signs depend on the reduction order.
inline ModelSpec resnet_tiny(int micro_batch) {
  ModelSpec m{"resnet", "resnet-tiny", {}, 32, {}, micro_batch};
  m.optimizer.name = "sgd";
  m.optimizer.lr = 0.02;
  m.optimizer.momentum = 0.9;
  return m;
}
// 2112 + 4160 + 585 = 6857 parameters: odd, and the head's 585 is odd too.
inline ModelSpec mlp_odd() { return {"mlp", "mlp-tiny", {{"out", "9"}}, 16, {}}; }

struct PlanSpec {
  int stage = 0;
  int microbatches = 1;
  bool reshard = false;
  bool offload_params = false, offload_grads = false, offload_optimizer = false;
  bool checkpointing = false;
  std::string dtype = "fp32";  // param, compute and reduce dtype; fp16 with dynamic loss scaling
  std::int64_t reduce_buffer_elems = 0;  // stage 2 bucket; 0: the plan's default
  std::string label() const {
    std::string s = "stage" + std::to_string(stage) + "_m" + std::to_string(microbatches);
    if (dtype != "fp32") s += "_" + dtype;
    if (reshard) s += "_reshard";
    if (offload_params) s += "_offP";
    if (offload_grads) s += "_offG";
    if (offload_optimizer) s += "_offO";
    if (checkpointing) s += "_ckpt";
    if (reduce_buffer_elems > 0) s += "_rb" + std::to_string(reduce_buffer_elems);
    return s;
  }
};

inline Plan make_plan(const ModelSpec& m, int world, const PlanSpec& s, std::uint64_t seed = 7) {
  Plan p;
  p.world_size = world;
  p.global_batch = m.global_batch;
  p.microbatches = s.microbatches;
  p.micro_batch = m.global_batch / (world * s.microbatches);
  p.zero_stage = s.stage;
  p.reshard_after_forward = s.reshard;
  p.offload.params = s.offload_params;
  p.offload.grads = s.offload_grads;
  p.offload.optimizer = s.offload_optimizer;
  if (s.checkpointing) p.checkpointing.mode = Checkpointing::Mode::all;
  if (s.reduce_buffer_elems > 0) p.buckets.reduce_buffer_elems = s.reduce_buffer_elems;
  p.precision.param_dtype = p.precision.compute_dtype = p.precision.reduce_dtype = s.dtype;
  if (s.dtype == "fp16") p.precision.loss_scale.mode = LossScale::Mode::dynamic;
  p.optimizer = m.optimizer;
  p.seed = seed;
  return p;
}

inline zoo::Model build(const ModelSpec& m, std::uint64_t seed) {
  static std::mutex mutex;  // model init may touch the global generator
  std::lock_guard<std::mutex> lock(mutex);
  return zoo::build_model(m.name, m.preset, m.options, seed);
}

inline NamedTensors named_params(const zoo::Model& model) {
  NamedTensors out;
  for (const auto& u : model.units) {
    for (const auto& item : u.module->named_parameters(true)) out.emplace_back(u.name + "." + item.key(), item.value());
  }
  return out;
}

struct TrainResult {
  std::vector<double> losses;  // global mean per step
  NamedTensors params;
};

// The reference: the whole global batch in one process, plain autograd over the chained units,
// torch::optim.
inline TrainResult reference_run(const ModelSpec& m, const Plan& plan, int steps) {
  zoo::Model model = build(m, plan.seed);
  NamedTensors named = named_params(model);
  std::vector<torch::Tensor> params;
  for (auto& [n, p] : named) params.push_back(p);
  std::unique_ptr<torch::optim::Optimizer> opt;
  const auto& o = plan.optimizer;
  if (o.name == "sgd") {
    opt = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
  } else if (o.name == "adamw") {
    opt = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(o.lr).betas({o.betas[0], o.betas[1]}).eps(o.eps).weight_decay(o.weight_decay));
  } else {
    opt = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(o.lr).betas({o.betas[0], o.betas[1]}).eps(o.eps).weight_decay(o.weight_decay));
  }
  TrainResult r;
  const int micro = m.reference_micro_batch > 0 ? m.reference_micro_batch : plan.global_batch;
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    double loss_sum = 0;
    for (int first = 0; first < plan.global_batch; first += micro) {
      zoo::Batch b = model.task->batch(s, first, micro);
      torch::Tensor x = b.input;
      for (auto& u : model.units) x = u.module->forward(x);
      torch::Tensor loss = model.task->loss(x, b.target) * (static_cast<double>(micro) / plan.global_batch);
      loss.backward();
      loss_sum += loss.item<double>();
    }
    if (o.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(params, o.max_grad_norm);
    opt->step();
    r.losses.push_back(loss_sum);
  }
  for (auto& [n, p] : named) r.params.emplace_back(n, p.detach().clone());
  return r;
}

struct RankRun {
  std::vector<double> local_losses;
  NamedTensors params;
  NamedTensors buffers;  // every unit's buffers (BatchNorm's running statistics) after the steps, cloned
  std::int64_t shard_numel = 0;
  bool views_valid = true;
  std::vector<CollectiveCounts> step_counts;  // per step, when counted
};

// N threads, each an Executor over a ThreadCommunicator (optionally counted, with a delay).
inline std::vector<RankRun> thread_run(const ModelSpec& m, const Plan& plan, int steps, Device& device,
                                       std::chrono::microseconds delay = {}) {
  const int world = plan.world_size;
  ThreadHub hub(world);
  std::vector<RankRun> runs(static_cast<std::size_t>(world));
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        ThreadCommunicator inner(hub, r);
        CountingCommunicator comm(inner, delay);
        zoo::Model model = build(m, plan.seed);
        Recorder rec(r, false);
        Executor ex(model, plan, comm, device, rec);
        RankRun& run = runs[static_cast<std::size_t>(r)];
        for (int s = 0; s < steps; ++s) {
          comm.reset();
          run.local_losses.push_back(ex.step(s).loss);
          run.step_counts.push_back(comm.counts());
          run.views_valid = run.views_valid && ex.views_valid();
        }
        run.shard_numel = ex.optimizer_shard_numel();
        run.params = ex.full_parameters();
        for (const auto& u : model.units)
          for (const auto& item : u.module->named_buffers(true))
            run.buffers.emplace_back(u.name + "." + item.key(), item.value().detach().to(torch::kCPU).clone());
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
  }
  return runs;
}

inline std::vector<double> global_losses(const std::vector<RankRun>& runs) {
  std::vector<double> out(runs[0].local_losses.size(), 0.0);
  for (const auto& r : runs) {
    for (std::size_t i = 0; i < out.size() && i < r.local_losses.size(); ++i) out[i] += r.local_losses[i] / static_cast<double>(runs.size());
  }
  return out;
}

inline void expect_losses_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what,
                                double rtol = 1e-5, double atol = 1e-6) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << what << " step " << i;
  }
}

inline void expect_params_close(const NamedTensors& got, const NamedTensors& want, const std::string& what,
                                double rtol = 1e-5, double atol = 1e-6) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << what;
    ASSERT_EQ(got[i].second.sizes(), want[i].second.sizes()) << what << " " << got[i].first;
    const bool ok = torch::allclose(got[i].second, want[i].second, rtol, atol);
    EXPECT_TRUE(ok) << what << " " << got[i].first << " max abs diff "
                    << (got[i].second - want[i].second).abs().max().item<double>();
  }
}

}  // namespace zeroplan::exec::testing
