#include <zeroplan/profiles/zoo.h>

#include <gtest/gtest.h>

#include <cmath>

#include "train_util.h"

namespace zeroplan::zoo {
namespace {

// Closed form: wte + wpe + L x (2 LayerNorms, qkv, proj, fc 4h, proj) + ln_f (+ untied head).
int64_t gpt_parameters(int64_t layers, int64_t h, int64_t seq, int64_t vocab, bool tied) {
  const int64_t block = 2 * (2 * h) + (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h);
  return vocab * h + seq * h + layers * block + 2 * h + (tied ? 0 : vocab * h);
}

TEST(ZooGpt, ClosedFormGivesGpt2SmallCount) {
  EXPECT_EQ(gpt_parameters(12, 768, 1024, 50257, true), 124439808);
}

TEST(ZooGpt, TinyUnitsAndTiedHead) {
  Model model = build_model("gpt", "gpt2-tiny", {}, 0);
  std::vector<std::string> names;
  for (const Unit& unit : model.units) names.push_back(unit.name);
  EXPECT_EQ(names, (std::vector<std::string>{"embed", "block0", "block1", "head"}));
  EXPECT_EQ(model.units[0].type, "Embedding");
  EXPECT_EQ(model.units[1].type, "TransformerBlock");
  EXPECT_EQ(model.units[3].type, "Head");
  ASSERT_EQ(model.units[3].borrowed.size(), 1u);
  EXPECT_EQ(model.units[3].borrowed[0].owner_unit, 0);
  EXPECT_EQ(model.units[3].borrowed[0].owner_name, "wte.weight");
  EXPECT_TRUE(model.units[0].module->named_parameters().contains("wte.weight"));
  EXPECT_EQ(testing::unit_parameter_count(model.units[0]), 256 * 64 + 32 * 64);
  EXPECT_EQ(testing::unit_parameter_count(model.units[3]), 2 * 64);
  EXPECT_EQ(model.parameter_count(), gpt_parameters(2, 64, 32, 256, true));
  EXPECT_EQ(model.task->sample_shape(), (std::vector<int64_t>{32}));

  Batch batch = model.task->batch(0, 0, 3);
  EXPECT_EQ(batch.input.sizes(), (std::vector<int64_t>{3, 32}));
  EXPECT_EQ(batch.input.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(batch.input.narrow(1, 1, 31), batch.target.narrow(1, 0, 31)));
  torch::Tensor logits = testing::run_units(model, batch.input);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 32, 256}));

  // The head uses embed's wte.weight: its gradient collects both uses.
  model.task->loss(logits, batch.target).backward();
  EXPECT_TRUE(model.units[0].module->named_parameters()["wte.weight"].grad().defined());
}

TEST(ZooGpt, HeadReadsTheOwnersCurrentWeight) {
  Model model = build_model("gpt", "gpt2-tiny", {}, 0);
  torch::NoGradGuard no_grad;
  torch::Tensor x = torch::randn({1, 4, 64});
  torch::Tensor before = model.units.back().module->forward(x);
  torch::Tensor wte = model.units[0].module->named_parameters()["wte.weight"];
  wte.set_data(wte * 2.0);
  torch::Tensor after = model.units.back().module->forward(x);
  EXPECT_TRUE(torch::allclose(after, before * 2.0, 1e-5, 1e-6));
}

TEST(ZooGpt, UntiedHeadOwnsItsWeight) {
  Model model = build_model("gpt", "gpt2-tiny", {{"tied", "false"}}, 0);
  EXPECT_TRUE(model.units.back().borrowed.empty());
  EXPECT_EQ(testing::unit_parameter_count(model.units.back()), 2 * 64 + 256 * 64);
  EXPECT_EQ(model.parameter_count(), gpt_parameters(2, 64, 32, 256, false));
}

TEST(ZooGpt, AttentionIsCausal) {
  Model model = build_model("gpt", "gpt2-tiny", {}, 0);
  torch::NoGradGuard no_grad;
  torch::Tensor tokens = model.task->batch(0, 0, 1).input;
  torch::Tensor changed = tokens.clone();
  changed[0][20] = (changed[0][20].item<int64_t>() + 1) % 256;
  torch::Tensor a = testing::run_units(model, tokens);
  torch::Tensor b = testing::run_units(model, changed);
  EXPECT_TRUE(torch::equal(a.narrow(1, 0, 20), b.narrow(1, 0, 20)));
  EXPECT_FALSE(torch::equal(a.narrow(1, 20, 1), b.narrow(1, 20, 1)));
}

TEST(ZooGpt, ShorterSequencesAreAccepted) {
  Model model = build_model("gpt", "gpt2-tiny", {}, 0);
  torch::NoGradGuard no_grad;
  torch::Tensor tokens = model.task->batch(0, 0, 2).input.narrow(1, 0, 8);
  EXPECT_EQ(testing::run_units(model, tokens).sizes(), (std::vector<int64_t>{2, 8, 256}));
}

TEST(ZooGpt, SplittingABatchGivesTheSameSamples) {
  Model model = build_model("gpt", "gpt2-tiny", {}, 11);
  testing::expect_split_invariant(*model.task, 2, 10, 3);
}

TEST(ZooGpt, LossGoesDown) {
  Model model = build_model("gpt", "gpt2-tiny", {}, 0);
  std::vector<double> losses = testing::train_losses(model, 30, 16, 3e-3);
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);
  EXPECT_LT(testing::mean_of_last(losses, 5), 0.8 * losses.front()) << "first " << losses.front();
}

// units=sub-block cuts each block into its attention and its MLP half (FSDP's wrap of the two), with
// the same parameters from the same seed and the same forward; the halves own 4h^2 + 6h and 8h^2 + 7h
// parameters (the analytic gpt's split) and the registry refuses another value.
TEST(ZooGpt, SubBlocksSplitEachBlockIntoAttentionAndMlp) {
  Model blocks = build_model("gpt", "gpt2-tiny", {}, 5);
  Model halves = build_model("gpt", "gpt2-tiny", {{"units", "sub-block"}}, 5);
  std::vector<std::string> names, types;
  for (const Unit& unit : halves.units) {
    names.push_back(unit.name);
    types.push_back(unit.type);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"embed", "block0.attn", "block0.mlp", "block1.attn", "block1.mlp", "head"}));
  EXPECT_EQ(types, (std::vector<std::string>{"Embedding", "Attention", "MLP", "Attention", "MLP", "Head"}));
  const int64_t h = 64;
  EXPECT_EQ(testing::unit_parameter_count(halves.units[1]), 4 * h * h + 6 * h);
  EXPECT_EQ(testing::unit_parameter_count(halves.units[2]), 8 * h * h + 7 * h);
  EXPECT_EQ(halves.parameter_count(), blocks.parameter_count());
  const std::vector<torch::Tensor> a = testing::all_parameters(blocks), b = testing::all_parameters(halves);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
  torch::NoGradGuard no_grad;
  const torch::Tensor tokens = blocks.task->batch(0, 0, 2).input;
  EXPECT_TRUE(torch::equal(testing::run_units(blocks, tokens), testing::run_units(halves, tokens)));
  EXPECT_NE(testing::error_of([] { (void)build_model("gpt", "gpt2-tiny", {{"units", "layer"}}, 0); }).find("units"),
            std::string::npos);
}

TEST(ZooGpt, Gpt2SmallInstantiatedHas124439808Parameters) {
  Model model = build_model("gpt", "gpt2-small", {}, 0);
  EXPECT_EQ(model.units.size(), 14u);
  EXPECT_EQ(model.parameter_count(), 124439808);
}

// The training sequence length does not size the position table: gpt2-small keeps its 1024 rows.
TEST(ZooGpt, Gpt2SmallParameterCountDoesNotDependOnSeq) {
  Model model = build_model("gpt", "gpt2-small", {{"seq", "128"}, {"layers", "1"}}, 0);
  Model full = build_model("gpt", "gpt2-small", {{"layers", "1"}}, 0);
  EXPECT_EQ(model.parameter_count(), full.parameter_count());
  EXPECT_EQ(model.task->sample_shape(), std::vector<int64_t>{128});
  // Without a preset the table has seq rows unless positions says otherwise.
  Model small = build_model("gpt", "", {{"seq", "16"}}, 0);
  Model wide = build_model("gpt", "", {{"seq", "16"}, {"positions", "48"}}, 0);
  EXPECT_EQ(wide.parameter_count() - small.parameter_count(), 32 * 64);
}

}  // namespace
}  // namespace zeroplan::zoo
