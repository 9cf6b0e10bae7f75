#include <zeroplan/profiles/zoo.h>

#include <gtest/gtest.h>

#include "train_util.h"

namespace zeroplan::zoo {
namespace {

TEST(ZooMlp, UnitsAreHiddenLayersThenHead) {
  Model model = build_model("mlp", "", {{"depth", "3"}, {"width", "64"}, {"in", "20"}, {"out", "5"}}, 1);
  ASSERT_EQ(model.units.size(), 3u);
  EXPECT_EQ(model.units[0].name, "layer0");
  EXPECT_EQ(model.units[1].name, "layer1");
  EXPECT_EQ(model.units[2].name, "head");
  EXPECT_EQ(model.units[0].type, "Linear");
  EXPECT_EQ(model.units[2].type, "Head");
  EXPECT_EQ(testing::unit_parameter_count(model.units[0]), 20 * 64 + 64);
  EXPECT_EQ(testing::unit_parameter_count(model.units[1]), 64 * 64 + 64);
  EXPECT_EQ(testing::unit_parameter_count(model.units[2]), 64 * 5 + 5);
  EXPECT_EQ(model.parameter_count(), 20 * 64 + 64 + 64 * 64 + 64 + 64 * 5 + 5);
  EXPECT_EQ(model.task->sample_shape(), (std::vector<int64_t>{20}));
  Batch batch = model.task->batch(0, 0, 6);
  EXPECT_EQ(testing::run_units(model, batch.input).sizes(), (std::vector<int64_t>{6, 5}));
  EXPECT_EQ(batch.target.scalar_type(), torch::kInt64);
  EXPECT_TRUE((batch.target >= 0).all().item<bool>() && (batch.target < 5).all().item<bool>());
}

TEST(ZooMlp, DepthOneIsJustTheHead) {
  Model model = build_model("mlp", "", {{"depth", "1"}}, 1);
  ASSERT_EQ(model.units.size(), 1u);
  EXPECT_EQ(model.units[0].name, "head");
}

TEST(ZooMlp, SplittingABatchGivesTheSameSamples) {
  Model model = build_model("mlp", "mlp-tiny", {}, 3);
  testing::expect_split_invariant(*model.task, 5, 16, 7);
}

TEST(ZooMlp, LossGoesDown) {
  Model model = build_model("mlp", "mlp-tiny", {}, 0);
  std::vector<double> losses = testing::train_losses(model, 30, 64, 1e-2);
  EXPECT_LT(testing::mean_of_last(losses, 5), 0.75 * losses.front()) << "first " << losses.front();
}

}  // namespace
}  // namespace zeroplan::zoo
