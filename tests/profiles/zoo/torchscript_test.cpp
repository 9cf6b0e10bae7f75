#include <zeroplan/profiles/errors.h>
#include <zeroplan/profiles/zoo.h>

#include <gtest/gtest.h>

#include "train_util.h"

namespace zeroplan::zoo {
namespace {

// Written at build time by make_scripted_mlp.py: Sequential(Sequential(Linear(16,32), ReLU), Linear(32,8)).
const std::string kScriptedMlp = std::string(ZOO_TEST_FIXTURES) + "/scripted_mlp.pt";

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

}  // namespace
}  // namespace zeroplan::zoo
