#include <zeroplan/profiles/errors.h>
#include <zeroplan/profiles/zoo.h>

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "train_util.h"

namespace zeroplan::zoo {
namespace {

// Written at build time by make_scripted_mlp.py: Sequential(Sequential(Linear(16,32), ReLU), Linear(32,8)).
const std::string kScriptedMlp = std::string(ZOO_TEST_FIXTURES) + "/scripted_mlp.pt";
// make_scripted_cnn.py: stem (conv, BatchNorm), relu (in place, top level), pool, stage1, stage2, head
// (10 classes) on 3 x 16 x 16 images. make_scripted_lm.py: Embedding(16, 32) then Linear(32, 16).
const std::string kScriptedCnn = std::string(ZOO_TEST_FIXTURES) + "/scripted_cnn.pt";
const std::string kScriptedLm = std::string(ZOO_TEST_FIXTURES) + "/scripted_lm.pt";

using testing::error_of;

TEST(ZooTorchScript, PerUnitParameterCountsMatchTheCppModel) {
  Model scripted = load_torchscript(kScriptedMlp, {16}, 0);
  Model native = build_model("mlp", "", {{"depth", "2"}, {"width", "32"}, {"in", "16"}, {"out", "8"}}, 0);
  EXPECT_EQ(scripted.name, "torchscript");
  ASSERT_EQ(scripted.units.size(), native.units.size());
  for (size_t i = 0; i < scripted.units.size(); ++i) {
    EXPECT_EQ(testing::unit_parameter_count(scripted.units[i]), testing::unit_parameter_count(native.units[i]));
  }
  EXPECT_EQ(scripted.parameter_count(), native.parameter_count());
  EXPECT_EQ(scripted.units[0].name, "0");
  EXPECT_EQ(scripted.units[0].type, "Sequential");
  EXPECT_EQ(scripted.units[1].type, "Linear");
  EXPECT_TRUE(scripted.units[1].module->named_parameters().contains("weight"));
  EXPECT_TRUE(scripted.units[0].module->named_parameters().contains("0_weight"));

  // Same parameters, same function.
  {
    torch::NoGradGuard no_grad;
    auto from = testing::all_parameters(scripted);
    auto to = testing::all_parameters(native);
    ASSERT_EQ(from.size(), to.size());
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  Batch batch = scripted.task->batch(0, 0, 4);
  EXPECT_TRUE(torch::allclose(testing::run_units(scripted, batch.input), testing::run_units(native, batch.input)));
}

TEST(ZooTorchScript, RegisteredParametersAreTheScriptsTensors) {
  Model model = load_torchscript(kScriptedMlp, {16}, 0);
  torch::NoGradGuard no_grad;
  torch::Tensor x = torch::randn({2, 32});
  for (torch::Tensor& p : model.units[1].module->parameters()) p.zero_();
  EXPECT_TRUE(torch::equal(model.units[1].module->forward(x), torch::zeros({2, 8})));
}

TEST(ZooTorchScript, LossGoesDownAndSamplesSplit) {
  Model model = load_torchscript(kScriptedMlp, {16}, 0);
  EXPECT_EQ(model.task->sample_shape(), (std::vector<int64_t>{16}));
  testing::expect_split_invariant(*model.task, 1, 8, 5);
  std::vector<double> losses = testing::train_losses(model, 30, 16, 1e-2);
  EXPECT_LT(testing::mean_of_last(losses, 5), 0.5 * losses.front()) << "first " << losses.front();
}

TEST(ZooTorchScript, BadFileOrShapeIsASchemaError) {
  EXPECT_THROW(load_torchscript("/nonexistent/model.pt", {16}, 0), SchemaError);
  EXPECT_THROW(load_torchscript(kScriptedMlp, {15}, 0), SchemaError);
  EXPECT_THROW(load_torchscript(kScriptedMlp, {}, 0), SchemaError);
}

TEST(ZooTorchScript, CnnClassifiesAndTheInPlaceChildGetsACopy) {
  Model model = load_torchscript(kScriptedCnn, {3, 16, 16}, 0, ScriptTask{"classify", 10, 0});
  ASSERT_EQ(model.units.size(), 6u);
  EXPECT_EQ(model.units[1].name, "relu");
  EXPECT_NE(model.units[1].type.find("copies its input"), std::string::npos) << model.units[1].type;
  EXPECT_EQ(model.units[0].type.find("copies"), std::string::npos);
  testing::expect_split_invariant(*model.task, 1, 8, 5);
  Batch batch = model.task->batch(0, 0, 4);
  EXPECT_EQ(batch.target.scalar_type(), torch::kInt64);
  EXPECT_EQ(batch.target.sizes(), (std::vector<int64_t>{4}));
  // The in-place child on a leaf that requires grad (as the executor feeds every unit) works.
  torch::Tensor leaf = torch::randn({2, 16, 16, 16}).requires_grad_();
  torch::Tensor y = model.units[1].module->forward(leaf);
  y.sum().backward();
  EXPECT_TRUE(torch::equal(leaf.grad(), (leaf.detach() > 0).to(torch::kFloat32)));
  // The classes are learnable: the loss falls.
  std::vector<double> losses = testing::train_losses(model, 25, 16, 1e-2);
  EXPECT_NEAR(losses.front(), std::log(10.0), 0.6);
  EXPECT_LT(testing::mean_of_last(losses, 5), 0.7 * losses.front()) << "first " << losses.front();
}

TEST(ZooTorchScript, LanguageModelOnTokens) {
  Model model = load_torchscript(kScriptedLm, {8}, 0, ScriptTask{"lm", 0, 16});
  Batch batch = model.task->batch(0, 0, 3);
  EXPECT_EQ(batch.input.scalar_type(), torch::kInt64);
  EXPECT_EQ(batch.input.sizes(), (std::vector<int64_t>{3, 8}));
  EXPECT_LT(batch.input.max().item<int64_t>(), 16);
  std::vector<double> losses = testing::train_losses(model, 30, 16, 3e-2);
  EXPECT_NEAR(losses.front(), std::log(16.0), 0.5);
  EXPECT_LT(testing::mean_of_last(losses, 5), 0.8 * losses.front()) << "first " << losses.front();
}

TEST(ZooTorchScript, TaskMismatchesNameTheNumbers) {
  EXPECT_EQ(error_of([] { load_torchscript(kScriptedCnn, {3, 16, 16}, 0, ScriptTask{"classify", 7, 0}); }),
            "torchscript " + kScriptedCnn + ": task classify with --classes 7 needs an output [batch, 7], got [2, 10]");
  EXPECT_EQ(error_of([] { load_torchscript(kScriptedCnn, {3, 16, 16}, 0, ScriptTask{"classify", 1, 0}); }),
            "torchscript " + kScriptedCnn + ": task classify needs --classes >= 2, got 1");
  EXPECT_EQ(error_of([] { load_torchscript(kScriptedMlp, {16}, 0, ScriptTask{"segment", 0, 0}); }),
            "torchscript " + kScriptedMlp + ": unknown task \"segment\" (tasks: regress, classify, lm)");
  EXPECT_EQ(error_of([] { load_torchscript(kScriptedLm, {8}, 0, ScriptTask{"lm", 0, 0}); }),
            "torchscript " + kScriptedLm + ": task lm needs --vocab >= 2 (got 0) and a token input shape [T] (got [8])");
  // A wrong input shape: torch's own cause, one line, naming the child.
  const std::string e = error_of([] { load_torchscript(kScriptedCnn, {4, 16, 16}, 0, ScriptTask{"classify", 10, 0}); });
  EXPECT_EQ(e.rfind("torchscript " + kScriptedCnn + ": child stem (Sequential) failed on input [2, 4, 16, 16]: ", 0), 0u) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  EXPECT_EQ(e.find("TorchScript interpreter"), std::string::npos) << e;
}

}  // namespace
}  // namespace zeroplan::zoo
