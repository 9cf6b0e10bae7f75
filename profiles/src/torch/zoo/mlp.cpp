// mlp: `depth` Linear layers of `width`; units layer0..layer{depth-2} (Linear + ReLU) and head (Linear).
// Task: classify Gaussian inputs by a fixed random linear teacher, label = argmax(W x).
#include "zoo_impl.h"


namespace zeroplan::zoo::detail {
namespace {

class LinearReluUnit : public UnitModule {
 public:
  LinearReluUnit(int64_t in, int64_t out, bool relu)
      : fc(register_module("fc", torch::nn::Linear(in, out))), relu_(relu) {}
  torch::Tensor forward(const torch::Tensor& input) override {
    torch::Tensor y = fc(input);
    return relu_ ? torch::relu(y) : y;
  }
  torch::nn::Linear fc;

 private:
  bool relu_;
};

// Samples are generated one by one from Rng(sample_key(seed, step, j)).
class TeacherClassification : public Task {
 public:
  TeacherClassification(uint64_t seed, int64_t in, int64_t classes)
      : seed_(seed), in_(in), classes_(classes), teacher_(static_cast<size_t>(in * classes)) {
    Rng rng(teacher_key(seed));
    for (double& w : teacher_) w = rng.normal();
  }

  Batch batch(int64_t step, int64_t first_sample, int64_t count) const override {
    TORCH_CHECK(step >= 0 && first_sample >= 0 && count >= 1, "mlp task: bad batch request");
    torch::Tensor input = torch::empty({count, in_}, torch::kFloat32);
    torch::Tensor target = torch::empty({count}, torch::kInt64);
    auto x = input.accessor<float, 2>();
    auto t = target.accessor<int64_t, 1>();
    std::vector<double> sample(static_cast<size_t>(in_));
    for (int64_t j = 0; j < count; ++j) {
      Rng rng(sample_key(seed_, step, first_sample + j));
      for (int64_t i = 0; i < in_; ++i) {
        sample[static_cast<size_t>(i)] = rng.normal();
        x[j][i] = static_cast<float>(sample[static_cast<size_t>(i)]);
      }
      int64_t best = 0;
      double best_score = 0.0;
      for (int64_t c = 0; c < classes_; ++c) {
        double score = 0.0;
        for (int64_t i = 0; i < in_; ++i) score += teacher_[static_cast<size_t>(c * in_ + i)] * sample[static_cast<size_t>(i)];
        if (c == 0 || score > best_score) {
          best = c;
          best_score = score;
        }
      }
      t[j] = best;
    }
    return {input, target};
  }

  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const override {
    return torch::nn::functional::cross_entropy(output, target.to(output.device()));
  }

  std::vector<int64_t> sample_shape() const override { return {in_}; }
  bool batches_in_background() const override { return true; }

 private:
  uint64_t seed_;
  int64_t in_;
  int64_t classes_;
  std::vector<double> teacher_;  // classes x in, row-major
};

}  // namespace

ModelInfo mlp_info() {
  return {"mlp",
          "multi-layer perceptron of Linear+ReLU units; task: classify inputs by a random linear teacher",
          {{"depth", "4", "number of Linear layers (= units; the last is the head)"},
           {"width", "256", "hidden features"},
           {"in", "32", "input features"},
           {"out", "10", "classes"}},
          {{"mlp-tiny", {{"depth", "3"}, {"width", "64"}, {"in", "32"}, {"out", "10"}}},
           {"mlp-large", {{"depth", "16"}, {"width", "4096"}, {"in", "1024"}, {"out", "1000"}}}}};
}

Model build_mlp(const Options& options, uint64_t seed, bool options_only) {
  const int64_t depth = int_option("mlp", options, "depth");
  const int64_t width = int_option("mlp", options, "width");
  const int64_t in = int_option("mlp", options, "in");
  const int64_t out = int_option("mlp", options, "out", 2);
  if (options_only) return {};
  at::Generator gen = param_generator(seed);
  Model model;
  for (int64_t i = 0; i < depth; ++i) {
    const bool last = i + 1 == depth;
    auto unit = std::make_shared<LinearReluUnit>(i == 0 ? in : width, last ? out : width, !last);
    init_linear_default(*unit->fc, gen);
    model.units.push_back({last ? "head" : c10::str("layer", i), last ? "Head" : "Linear", unit, {}});
  }
  model.task = std::make_unique<TeacherClassification>(seed, in, out);
  return model;
}

}  // namespace zeroplan::zoo::detail
