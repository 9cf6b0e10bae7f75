// resnet: torchvision's ResNet (v1.5: stride on the 3x3 conv) in units stem (conv1, bn1, relu, maxpool),
// layer1..layer4 (stages; blocks named 0, 1, ... as in torchvision) and head (avgpool, fc).
// Task: images whose class sets a fixed random 4x4 colour pattern, plus Gaussian noise.
#include "zoo_impl.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <zeroplan/config.h>
#if ZEROPLAN_HAVE_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <zeroplan/profiles/errors.h>

#include <cmath>
#include <mutex>

namespace zeroplan::zoo::detail {
namespace {

namespace nn = torch::nn;

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

class BlockImpl : public nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
};

class BasicBlock : public BlockImpl {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t in, int64_t planes, int64_t stride)
      : conv1(register_module("conv1", conv(in, planes, 3, stride))),
        bn1(register_module("bn1", nn::BatchNorm2d(planes))),
        conv2(register_module("conv2", conv(planes, planes, 3, 1))),
        bn2(register_module("bn2", nn::BatchNorm2d(planes))) {
    if (stride != 1 || in != planes * kExpansion) {
      downsample = register_module("downsample",
                                   nn::Sequential(conv(in, planes * kExpansion, 1, stride), nn::BatchNorm2d(planes * kExpansion)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (downsample ? downsample->forward(x) : x));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Sequential downsample{nullptr};
};

class Bottleneck : public BlockImpl {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t in, int64_t planes, int64_t stride)
      : conv1(register_module("conv1", conv(in, planes, 1, 1))),
        bn1(register_module("bn1", nn::BatchNorm2d(planes))),
        conv2(register_module("conv2", conv(planes, planes, 3, stride))),
        bn2(register_module("bn2", nn::BatchNorm2d(planes))),
        conv3(register_module("conv3", conv(planes, planes * kExpansion, 1, 1))),
        bn3(register_module("bn3", nn::BatchNorm2d(planes * kExpansion))) {
    if (stride != 1 || in != planes * kExpansion) {
      downsample = register_module("downsample",
                                   nn::Sequential(conv(in, planes * kExpansion, 1, stride), nn::BatchNorm2d(planes * kExpansion)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor y = torch::relu(bn1(conv1(x)));
    y = torch::relu(bn2(conv2(y)));
    y = bn3(conv3(y));
    return torch::relu(y + (downsample ? downsample->forward(x) : x));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Conv2d conv3;
  nn::BatchNorm2d bn3;
  nn::Sequential downsample{nullptr};
};

class StemUnit : public UnitModule {
 public:
  explicit StemUnit(int64_t width)
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, width, 7).stride(2).padding(3).bias(false)))),
        bn1(register_module("bn1", nn::BatchNorm2d(width))) {}
  torch::Tensor forward(const torch::Tensor& input) override {
    return torch::max_pool2d(torch::relu(bn1(conv1(input))), /*kernel_size=*/3, /*stride=*/2, /*padding=*/1);
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
};

class StageUnit : public UnitModule {
 public:
  void add(std::shared_ptr<BlockImpl> block) {
    blocks_.push_back(register_module(std::to_string(blocks_.size()), std::move(block)));
  }
  torch::Tensor forward(const torch::Tensor& input) override {
    torch::Tensor x = input;
    for (auto& block : blocks_) x = block->forward(x);
    return x;
  }

 private:
  std::vector<std::shared_ptr<BlockImpl>> blocks_;
};

class ResNetHeadUnit : public UnitModule {
 public:
  ResNetHeadUnit(int64_t features, int64_t classes) : fc(register_module("fc", nn::Linear(features, classes))) {}
  torch::Tensor forward(const torch::Tensor& input) override {
    return fc(torch::adaptive_avg_pool2d(input, {1, 1}).flatten(1));
  }
  nn::Linear fc;
};

// Class c has a fixed 3 x 4 x 4 pattern of N(0, 1) values (from the seed), shown in nearest-neighbour
// blocks over the image, plus N(0, 1) noise per pixel. Each sample on its own: the class from
// Rng(sample_key(seed, step, j)), the noise from ATen's vectorized normal under a CPU generator seeded
// with that key (a 256-image batch of 224 x 224 is 38M normals: ~1 s one at a time with Rng, a few tens
// of milliseconds this way), so the samples are made in parallel with the same bits on any thread count.
class PatternImages : public Task {
 public:
  static constexpr int64_t kGrid = 4;
  PatternImages(uint64_t seed, int64_t image, int64_t classes)
      : seed_(seed), image_(image), classes_(classes), patterns_(torch::empty({classes, 3, kGrid, kGrid}, torch::kFloat32)) {
    Rng rng(teacher_key(seed));
    float* p = patterns_.data_ptr<float>();
    for (int64_t i = 0; i < patterns_.numel(); ++i) p[i] = static_cast<float>(rng.normal());
    // Pixel y of the image shows grid row y * kGrid / image (nearest neighbour), the same for columns.
    blocks_ = torch::arange(image, torch::kInt64).mul_(kGrid).floor_divide_(image);
  }

  Batch batch(int64_t step, int64_t first_sample, int64_t count) const override {
    TORCH_CHECK(step >= 0 && first_sample >= 0 && count >= 1, "resnet task: bad batch request");
    torch::Tensor input = torch::empty({count, 3, image_, image_}, torch::kFloat32);
    torch::Tensor target = classes_of(step, first_sample, count);
    auto t = target.accessor<int64_t, 1>();
    at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        at::Generator gen = at::detail::createCPUGenerator(sample_key(seed_, step, first_sample + j));
        torch::Tensor x = input[j];
        x.normal_(0.0, 1.0, gen);
        x.add_(patterns_[t[j]].index_select(1, blocks_).index_select(2, blocks_));
      }
    });
    return {input, target};
  }

  bool draws_on(const torch::Device& device) const override { return ZEROPLAN_HAVE_CUDA && device.is_cuda(); }

  // On CUDA: each sample's noise from a CUDA generator seeded with its key, the patterns added in one go.
  Batch batch_on(const torch::Device& device, int64_t step, int64_t first_sample, int64_t count) const override {
#if ZEROPLAN_HAVE_CUDA
    if (!device.is_cuda()) return batch(step, first_sample, count);
    TORCH_CHECK(step >= 0 && first_sample >= 0 && count >= 1, "resnet task: bad batch request");
    const torch::Tensor target = classes_of(step, first_sample, count).to(device);
    torch::Tensor input = torch::empty({count, 3, image_, image_}, torch::TensorOptions().device(device).dtype(torch::kFloat32));
    at::Generator gen = at::cuda::detail::createCUDAGenerator(device.index());
    for (int64_t j = 0; j < count; ++j) {
      {
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_current_seed(sample_key(seed_, step, first_sample + j));
      }
      input[j].normal_(0.0, 1.0, gen);
    }
    const torch::Tensor blocks = blocks_.to(device);
    input.add_(patterns_.to(device).index_select(0, target).index_select(2, blocks).index_select(3, blocks));
    return {input, target};
#else
    return batch(step, first_sample, count);
#endif
  }

  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const override {
    return torch::nn::functional::cross_entropy(output, target.to(output.device()));
  }

  std::vector<int64_t> sample_shape() const override { return {3, image_, image_}; }
  bool batches_in_background() const override { return true; }

 private:
  // Each sample's class, from Rng(sample_key(seed, step, j)), on the CPU (both devices draw the same).
  torch::Tensor classes_of(int64_t step, int64_t first_sample, int64_t count) const {
    torch::Tensor classes = torch::empty({count}, torch::kInt64);
    auto t = classes.accessor<int64_t, 1>();
    for (int64_t j = 0; j < count; ++j) t[j] = Rng(sample_key(seed_, step, first_sample + j)).below(classes_);
    return classes;
  }

  uint64_t seed_;
  int64_t image_;
  int64_t classes_;
  torch::Tensor patterns_;  // classes x 3 x kGrid x kGrid
  torch::Tensor blocks_;    // per pixel row (and column), its grid row (column)
};

struct Layout {
  const char* name;
  bool bottleneck;
  int64_t blocks[4];
};
constexpr Layout kLayouts[] = {{"resnet18", false, {2, 2, 2, 2}},
                               {"resnet34", false, {3, 4, 6, 3}},
                               {"resnet50", true, {3, 4, 6, 3}},
                               {"resnet101", true, {3, 4, 23, 3}},
                               {"resnet152", true, {3, 8, 36, 3}}};

// torchvision's initialisation: convs kaiming_normal(fan_out, relu), BatchNorm 1 and 0, fc the Linear
// default; drawn from `gen` in registration order.
void init_resnet(nn::Module& module, at::Generator& gen) {
  for (auto& child : module.modules(/*include_self=*/true)) {
    if (auto* c = child->as<nn::Conv2d>()) {
      const auto& k = c->options.kernel_size();
      const double fan_out = static_cast<double>(c->options.out_channels() * (*k)[0] * (*k)[1]);
      c->weight.normal_(0.0, std::sqrt(2.0 / fan_out), gen);
    } else if (auto* bn = child->as<nn::BatchNorm2d>()) {
      bn->weight.fill_(1.0);
      bn->bias.zero_();
    } else if (auto* linear = child->as<nn::Linear>()) {
      init_linear_default(*linear, gen);
    }
  }
}

}  // namespace

ModelInfo resnet_info() {
  return {"resnet",
          "ResNet (torchvision layout) in stem, 4 stages and head; task: classify noisy class patterns",
          {{"layout", "resnet18", "resnet18, resnet34, resnet50, resnet101 or resnet152"},
           {"image", "224", "image height and width in pixels"},
           {"classes", "1000", "classes"},
           {"width", "64", "channels of the stem (stages use 1, 2, 4, 8 times this)"}},
          {{"resnet18", {{"layout", "resnet18"}, {"image", "224"}, {"classes", "1000"}}},
           {"resnet50", {{"layout", "resnet50"}, {"image", "224"}, {"classes", "1000"}}},
           {"resnet-tiny", {{"layout", "resnet18"}, {"image", "64"}, {"classes", "10"}, {"width", "8"}}}}};
}

Model build_resnet(const Options& options, uint64_t seed, bool options_only) {
  std::vector<std::string> names;
  for (const Layout& l : kLayouts) names.push_back(l.name);
  const std::string layout_name = choice_option("resnet", options, "layout", names);
  const int64_t image = int_option("resnet", options, "image", 8);
  const int64_t classes = int_option("resnet", options, "classes", 2);
  const int64_t width = int_option("resnet", options, "width");
  const Layout* layout = nullptr;
  for (const Layout& l : kLayouts) {
    if (layout_name == l.name) layout = &l;
  }
  TORCH_INTERNAL_ASSERT(layout != nullptr);
  const int64_t expansion = layout->bottleneck ? Bottleneck::kExpansion : BasicBlock::kExpansion;
  if (options_only) return {};

  at::Generator gen = param_generator(seed);
  Model model;
  auto stem = std::make_shared<StemUnit>(width);
  init_resnet(*stem, gen);
  model.units.push_back({"stem", "ResNetStem", stem, {}});
  int64_t in = width;
  for (int s = 0; s < 4; ++s) {
    const int64_t planes = width << s;
    auto stage = std::make_shared<StageUnit>();
    for (int64_t b = 0; b < layout->blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      if (layout->bottleneck) {
        stage->add(std::make_shared<Bottleneck>(in, planes, stride));
      } else {
        stage->add(std::make_shared<BasicBlock>(in, planes, stride));
      }
      in = planes * expansion;
    }
    init_resnet(*stage, gen);
    model.units.push_back({c10::str("layer", s + 1), "ResNetStage", stage, {}});
  }
  auto head = std::make_shared<ResNetHeadUnit>(in, classes);
  init_resnet(*head, gen);
  model.units.push_back({"head", "Head", head, {}});
  model.task = std::make_unique<PatternImages>(seed, image, classes);
  return model;
}

}  // namespace zeroplan::zoo::detail
