// FlatOptimizer (PyTorch's fused kernels over flat segments) against torch::optim stepping the same
// values as separate tensors: Adam, AdamW and SGD, with and without weight decay / momentum, over
// several steps, with an empty segment (a rank whose shard of a unit is empty) among them.
#include <zeroplan/exec/exec_errors.h>
#include <zeroplan/exec/optimizer.h>

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace zeroplan::exec {
namespace {

struct Case {
  std::string name;
  double weight_decay;
  double momentum;
};

class FlatOptimizerParity : public ::testing::TestWithParam<Case> {};

std::unique_ptr<torch::optim::Optimizer> reference(const Optimizer& o, std::vector<torch::Tensor> params) {
  if (o.name == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
  }
  if (o.name == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(o.lr).betas({o.betas[0], o.betas[1]}).eps(o.eps).weight_decay(o.weight_decay));
  }
  return std::make_unique<torch::optim::Adam>(
      params, torch::optim::AdamOptions(o.lr).betas({o.betas[0], o.betas[1]}).eps(o.eps).weight_decay(o.weight_decay));
}

TEST_P(FlatOptimizerParity, MatchesTorchOptimOverFiveSteps) {
  const Case& c = GetParam();
  Optimizer o;
  o.name = c.name;
  o.lr = c.name == "sgd" ? 0.05 : 1e-2;
  o.weight_decay = c.weight_decay;
  o.momentum = c.momentum;
  const std::vector<std::int64_t> segments = {1000, 0, 37, 3 * 1024 + 5};
  torch::manual_seed(3);
  std::vector<torch::Tensor> params, grads, ref_params, initial;
  for (std::int64_t n : segments) {
    params.push_back(torch::randn({n}));
    grads.push_back(torch::zeros({n}));
    ref_params.push_back(params.back().clone().requires_grad_(true));
    initial.push_back(params.back().clone());
  }
  FlatOptimizer flat(o, segments, [](std::int64_t n) { return torch::zeros({n}); });
  auto ref = reference(o, ref_params);
  for (int step = 0; step < 5; ++step) {
    for (std::size_t i = 0; i < segments.size(); ++i) {
      grads[i].copy_(torch::randn({segments[i]}) * 0.1);
      ref_params[i].mutable_grad() = grads[i].clone();
    }
    flat.step(params, grads);
    ref->step();
    for (std::size_t i = 0; i < segments.size(); ++i) {
      ASSERT_TRUE(torch::allclose(params[i], ref_params[i].detach(), 1e-5, 1e-6))
          << c.name << " step " << step << " segment " << i << ": max diff "
          << (params[i] - ref_params[i].detach()).abs().max().item<float>();
    }
  }
  EXPECT_EQ(flat.steps(), 5);
  // The parameters moved (a kernel that did nothing would match a reference that did nothing).
  for (std::size_t i : {0u, 2u, 3u}) EXPECT_GT((params[i] - initial[i]).abs().max().item<float>(), 1e-3) << i;
}

INSTANTIATE_TEST_SUITE_P(Kinds, FlatOptimizerParity,
                         ::testing::Values(Case{"adam", 0.0, 0.0}, Case{"adam", 0.1, 0.0}, Case{"adamw", 0.1, 0.0},
                                           Case{"sgd", 0.0, 0.0}, Case{"sgd", 0.0, 0.9}, Case{"sgd", 0.01, 0.9}),
                         [](const auto& info) {
                           return info.param.name + "_wd" + std::to_string(static_cast<int>(info.param.weight_decay * 100)) +
                                  "_mom" + std::to_string(static_cast<int>(info.param.momentum * 10));
                         });

TEST(FlatOptimizer, StateIsKTimesTheSegments) {
  Optimizer adam;
  adam.name = "adam";
  FlatOptimizer a(adam, {10, 0, 5}, [](std::int64_t n) { return torch::zeros({n}); });
  EXPECT_EQ(a.state_numel(), 30);
  Optimizer sgd;
  sgd.name = "sgd";
  FlatOptimizer plain(sgd, {10, 5}, [](std::int64_t n) { return torch::zeros({n}); });
  EXPECT_EQ(plain.state_numel(), 0);
  sgd.momentum = 0.9;
  FlatOptimizer mom(sgd, {10, 5}, [](std::int64_t n) { return torch::zeros({n}); });
  EXPECT_EQ(mom.state_numel(), 15);
}

TEST(FlatOptimizer, UnknownOptimizerIsOneLine) {
  Optimizer o;
  o.name = "lamb";
  try {
    FlatOptimizer f(o, {4}, [](std::int64_t n) { return torch::zeros({n}); });
    FAIL() << "no error";
  } catch (const ExecError& e) {
    EXPECT_STREQ(e.what(), "optimizer 'lamb' is not run by the executor (adam, adamw, sgd)");
  }
}

// AdaScale's estimator on constructed gradient samples (fairscale's closed forms).
TEST(AdaScaleGain, IdenticalSamplesGiveOneIndependentOnesGiveTheScale) {
  for (double S : {2.0, 4.0, 8.0}) {
    const double a = 3.0;  // |g_i|^2
    AdaScaleGain same(S);
    // Identical samples: sum |g_i|^2 = S a, |mean|^2 = a: no variance.
    for (int step = 0; step < 5; ++step) EXPECT_NEAR(same.update(S * a, a), 1.0, 1e-6) << "S " << S;
    // Orthogonal samples of equal norm: |mean|^2 = a / S: all variance, gain S.
    AdaScaleGain indep(S);
    for (int step = 0; step < 5; ++step) EXPECT_NEAR(indep.update(S * a, a / S), S, 1e-6 * S) << "S " << S;
  }
}

TEST(AdaScaleGain, OneSampleIsAlwaysOneAndTheAveragesAreDebiased) {
  AdaScaleGain one(1);
  EXPECT_EQ(one.update(5.0, 1.0), 1.0);
  // S = 2: var = sum - 2 mean, sqr = mean - var / 2; the first step's gain uses its own estimate exactly
  // (debiasing removes the zero start), the second a smoothing-weighted mix.
  AdaScaleGain g(2);
  const double var1 = 3.0 - 2 * 1.2, sqr1 = 1.2 - var1 / 2;  // 0.6, 0.9: no clamping
  EXPECT_NEAR(g.update(3.0, 1.2), (var1 + sqr1) / (var1 / 2 + sqr1), 1e-12);
  const double f = 1 - 2.0 / 1000;
  const double var2 = 4.0 - 2 * 1.5, sqr2 = 1.5 - var2 / 2;
  const double var_avg = (f * (1 - f) * var1 + (1 - f) * var2) / (f * (1 - f) + (1 - f));
  const double sqr_avg = (f * (1 - f) * sqr1 + (1 - f) * sqr2) / (f * (1 - f) + (1 - f));
  EXPECT_NEAR(g.update(4.0, 1.5), (var_avg + sqr_avg) / (var_avg / 2 + sqr_avg), 1e-12);
}

}  // namespace
}  // namespace zeroplan::exec
