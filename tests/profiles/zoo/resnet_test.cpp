#include <zeroplan/profiles/zoo.h>

#include <gtest/gtest.h>

#include "train_util.h"

namespace zeroplan::zoo {
namespace {

std::vector<std::string> unit_names(const Model& model) {
  std::vector<std::string> names;
  for (const Unit& unit : model.units) names.push_back(unit.name);
  return names;
}

TEST(ZooResnet, Resnet50Has25557032Parameters) {
  Model model = build_model("resnet", "resnet50", {}, 0);
  EXPECT_EQ(unit_names(model), (std::vector<std::string>{"stem", "layer1", "layer2", "layer3", "layer4", "head"}));
  EXPECT_EQ(model.parameter_count(), 25557032);
  EXPECT_EQ(testing::unit_parameter_count(model.units.back()), 2048 * 1000 + 1000);
  // torchvision's names inside a stage.
  EXPECT_TRUE(model.units[1].module->named_parameters().contains("0.downsample.0.weight"));
  EXPECT_TRUE(model.units[1].module->named_parameters().contains("2.conv3.weight"));
}

TEST(ZooResnet, Resnet18MatchesTorchvision) {
  Model model = build_model("resnet", "resnet18", {}, 0);
  EXPECT_EQ(model.parameter_count(), 11689512);
  EXPECT_EQ(model.units[0].type, "ResNetStem");
  EXPECT_EQ(model.units[1].type, "ResNetStage");
  EXPECT_EQ(model.units[5].type, "Head");
  EXPECT_EQ(testing::unit_parameter_count(model.units[0]), 64 * 3 * 49 + 2 * 64);
  EXPECT_EQ(model.task->sample_shape(), (std::vector<int64_t>{3, 224, 224}));
  torch::NoGradGuard no_grad;
  Batch batch = model.task->batch(0, 0, 2);
  std::vector<std::vector<int64_t>> shapes;
  torch::Tensor x = batch.input;
  for (Unit& unit : model.units) {
    x = unit.module->forward(x);
    shapes.push_back(x.sizes().vec());
  }
  EXPECT_EQ(shapes, (std::vector<std::vector<int64_t>>{
                        {2, 64, 56, 56}, {2, 64, 56, 56}, {2, 128, 28, 28}, {2, 256, 14, 14}, {2, 512, 7, 7}, {2, 1000}}));
}

TEST(ZooResnet, SplittingABatchGivesTheSameSamples) {
  Model model = build_model("resnet", "resnet-tiny", {}, 5);
  testing::expect_split_invariant(*model.task, 0, 6, 1);
}

TEST(ZooResnet, TinyLossGoesDown) {
  Model model = build_model("resnet", "resnet-tiny", {{"image", "16"}}, 0);
  std::vector<double> losses = testing::train_losses(model, 30, 16, 3e-3);
  EXPECT_LT(testing::mean_of_last(losses, 5), 0.7 * losses.front()) << "first " << losses.front();
}

}  // namespace
}  // namespace zeroplan::zoo
