#include <zeroplan/profiles/errors.h>
#include <zeroplan/profiles/counting_allocator.h>
#include <zeroplan/profiles/zoo.h>

#include <gtest/gtest.h>

#include <chrono>

#include "train_util.h"

namespace zeroplan::zoo {
namespace {

// One intra-op thread: on a shared, loaded machine OpenMP's spinning threads make the training tests
// 30x slower, and these tests check behaviour, not speed.
class SingleThreadEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { torch::set_num_threads(1); }
};
[[maybe_unused]] ::testing::Environment* const kSingleThread =
    ::testing::AddGlobalTestEnvironment(new SingleThreadEnvironment);

using testing::error_of;

TEST(ZooRegistry, ListsModelsWithDescriptionsOptionsAndPresets) {
  std::vector<std::string> names;
  for (const ModelInfo& info : registered_models()) {
    names.push_back(info.name);
    EXPECT_FALSE(info.description.empty()) << info.name;
    EXPECT_EQ(info.description.find('\n'), std::string::npos) << info.name;
    for (const OptionInfo& option : info.options) EXPECT_FALSE(option.help.empty()) << option.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"gpt", "mlp", "resnet"}));
  EXPECT_EQ(model_info("gpt").presets.size(), 5u);
  EXPECT_TRUE(model_info("resnet").presets.contains("resnet50"));
}

TEST(ZooRegistry, ErrorsNameWhatIsWrongAndWhatExists) {
  EXPECT_EQ(error_of([] { model_info("gtp"); }), "unknown model \"gtp\" (models: gpt, mlp, resnet)");
  EXPECT_EQ(error_of([] { build_model("gpt", "", {{"layer", "2"}}, 0); }),
            "model gpt: unknown option \"layer\" (options: layers, hidden, heads, seq, positions, vocab, tied, dropout, units)");
  EXPECT_EQ(error_of([] { build_model("gpt", "gpt2-huge", {}, 0); }),
            "model gpt: unknown preset \"gpt2-huge\" (presets: gpt2-large, gpt2-medium, gpt2-small, gpt2-tiny, gpt2-xl)");
  EXPECT_EQ(error_of([] { build_model("mlp", "", {{"depth", "two"}}, 0); }),
            "model mlp: option depth must be an integer >= 1, got \"two\"");
  EXPECT_EQ(error_of([] { build_model("mlp", "", {{"width", "0"}}, 0); }),
            "model mlp: option width must be an integer >= 1, got \"0\"");
  EXPECT_EQ(error_of([] { build_model("gpt", "", {{"tied", "maybe"}}, 0); }),
            "model gpt: option tied must be true or false, got \"maybe\"");
  EXPECT_EQ(error_of([] { build_model("gpt", "", {{"dropout", "1.5"}}, 0); }),
            "model gpt: option dropout must be a number in [0, 1], got \"1.5\"");
  EXPECT_EQ(error_of([] { build_model("gpt", "", {{"hidden", "66"}, {"heads", "4"}}, 0); }),
            "model gpt: hidden 66 is not divisible by heads 4");
  EXPECT_EQ(error_of([] { build_model("gpt", "", {{"seq", "64"}, {"positions", "32"}}, 0); }),
            "model gpt: seq 64 is longer than the position table (positions 32)");
  EXPECT_EQ(error_of([] { build_model("resnet", "", {{"layout", "resnet19"}}, 0); }),
            "model resnet: option layout must be one of resnet18, resnet34, resnet50, resnet101, resnet152, "
            "got \"resnet19\"");
}

// check_options gives build_model's errors without building: a launcher checks gpt2-xl (1.5B parameters,
// 6 GB to build) without allocating a tensor, before its ranks start.
TEST(ZooRegistry, CheckOptionsRefusesWhatBuildRefusesAndBuildsNothing) {
  EXPECT_EQ(error_of([] { check_options("gpt", "gpt2-tiny", {{"layers", "0"}}); }),
            "model gpt: option layers must be an integer >= 1, got \"0\"");
  EXPECT_EQ(error_of([] { check_options("gpt", "", {{"hidden", "66"}, {"heads", "4"}}); }),
            "model gpt: hidden 66 is not divisible by heads 4");
  EXPECT_EQ(error_of([] { check_options("mlp", "", {{"width", "0"}}); }),
            "model mlp: option width must be an integer >= 1, got \"0\"");
  EXPECT_EQ(error_of([] { check_options("resnet", "", {{"layout", "resnet19"}}); }),
            "model resnet: option layout must be one of resnet18, resnet34, resnet50, resnet101, resnet152, "
            "got \"resnet19\"");
  EXPECT_EQ(error_of([] { check_options("gtp", "", {}); }), "unknown model \"gtp\" (models: gpt, mlp, resnet)");
  ScopedCpuAllocator counted;  // every CPU tensor allocated while checking: none
  check_options("gpt", "gpt2-xl", {});
  EXPECT_EQ(counted.allocator().peak_bytes(), 0);
}

TEST(ZooRegistry, ResolveFillsDefaultsThenPresetThenOverrides) {
  Options options = resolve_options("gpt", "gpt2-small", {{"seq", "256"}});
  EXPECT_EQ(options.at("layers"), "12");
  EXPECT_EQ(options.at("vocab"), "50257");
  EXPECT_EQ(options.at("seq"), "256");
  EXPECT_EQ(options.at("tied"), "true");
  EXPECT_EQ(options.at("dropout"), "0");
  EXPECT_EQ(options.size(), model_info("gpt").options.size());
  EXPECT_EQ(resolve_options("mlp", "", {}).at("depth"), "4");
}

void expect_same_parameters(const Model& a, const Model& b, bool same) {
  auto pa = testing::all_parameters(a);
  auto pb = testing::all_parameters(b);
  ASSERT_EQ(pa.size(), pb.size());
  bool all_equal = true;
  for (size_t i = 0; i < pa.size(); ++i) all_equal = all_equal && torch::equal(pa[i], pb[i]);
  EXPECT_EQ(all_equal, same);
}

TEST(ZooRegistry, SameSeedGivesBitwiseEqualParametersAndLeavesGlobalRngAlone) {
  for (const auto& [name, preset] : std::vector<std::pair<std::string, std::string>>{
           {"mlp", "mlp-tiny"}, {"gpt", "gpt2-tiny"}, {"resnet", "resnet-tiny"}}) {
    SCOPED_TRACE(name);
    torch::manual_seed(123);
    torch::Tensor expected = torch::rand({4});
    torch::manual_seed(123);
    Model a = build_model(name, preset, {}, 7);
    torch::Tensor after = torch::rand({4});
    EXPECT_TRUE(torch::equal(expected, after)) << "building perturbed the default generator";
    torch::manual_seed(999);
    Model b = build_model(name, preset, {}, 7);
    Model c = build_model(name, preset, {}, 8);
    expect_same_parameters(a, b, true);
    expect_same_parameters(a, c, false);
    EXPECT_EQ(a.name, name);
    EXPECT_EQ(a.preset, preset);
    for (const Unit& unit : a.units) EXPECT_TRUE(unit.module->is_training());
  }
}

}  // namespace
}  // namespace zeroplan::zoo
