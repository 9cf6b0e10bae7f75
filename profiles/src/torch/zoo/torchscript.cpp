// TorchScript models: the top-level children of a scripted module are the units. Each child's
// parameters and buffers are registered, as the same tensors, on a UnitModule wrapper, so
// parameters(), to() and set_data() on the wrapper act on what the script computes with.
#include "zoo_impl.h"

#include <zeroplan/profiles/errors.h>

#include <torch/script.h>


#include <set>

namespace zeroplan::zoo {
namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// "0.weight" -> "0_weight": nn::Module names cannot contain dots. Collisions get a numeric suffix.
std::string unique_name(const std::string& dotted, std::set<std::string>& used) {
  std::string name = dotted;
  for (char& c : name) {
    if (c == '.') c = '_';
  }
  std::string candidate = name;
  for (int i = 1; used.contains(candidate); ++i) candidate = c10::str(name, "_", i);
  used.insert(candidate);
  return candidate;
}

class ScriptUnit : public UnitModule {
 public:
  explicit ScriptUnit(torch::jit::Module script) : script_(std::move(script)) {
    std::set<std::string> used;
    for (const auto& p : script_.named_parameters(/*recurse=*/true)) {
      register_parameter(unique_name(p.name, used), p.value, p.value.requires_grad());
    }
    for (const auto& b : script_.named_buffers(/*recurse=*/true)) {
      register_buffer(unique_name(b.name, used), b.value);
    }
  }
  torch::Tensor forward(const torch::Tensor& input) override { return script_.forward({input}).toTensor(); }
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    script_.train(on);
  }

 private:
  torch::jit::Module script_;
};

std::string type_name(const torch::jit::Module& module) {
  const auto& qualified = module.type()->name();
  return qualified ? qualified->name() : std::string("ScriptModule");
}

// Regress every sample's output onto one fixed N(0, 1) target (from the seed); inputs are N(0, 1),
// generated one by one from Rng(sample_key(seed, step, j)).
class FixedTargetRegression : public Task {
 public:
  FixedTargetRegression(uint64_t seed, std::vector<int64_t> sample_shape, std::vector<int64_t> output_shape)
      : seed_(seed), sample_shape_(std::move(sample_shape)), output_shape_(std::move(output_shape)) {
    target_ = torch::empty(output_shape_, torch::kFloat32);
    detail::Rng rng(detail::teacher_key(seed));
    float* t = target_.data_ptr<float>();
    for (int64_t i = 0; i < target_.numel(); ++i) t[i] = static_cast<float>(rng.normal());
  }

  Batch batch(int64_t step, int64_t first_sample, int64_t count) const override {
    TORCH_CHECK(step >= 0 && first_sample >= 0 && count >= 1, "torchscript task: bad batch request");
    std::vector<int64_t> shape = {count};
    shape.insert(shape.end(), sample_shape_.begin(), sample_shape_.end());
    torch::Tensor input = torch::empty(shape, torch::kFloat32);
    const int64_t per_sample = input.numel() / count;
    float* x = input.data_ptr<float>();
    for (int64_t j = 0; j < count; ++j) {
      detail::Rng rng(detail::sample_key(seed_, step, first_sample + j));
      for (int64_t i = 0; i < per_sample; ++i) x[j * per_sample + i] = static_cast<float>(rng.normal());
    }
    std::vector<int64_t> target_shape = {count};
    target_shape.insert(target_shape.end(), output_shape_.begin(), output_shape_.end());
    return {input, target_.unsqueeze(0).expand(target_shape).contiguous()};
  }

  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const override {
    return torch::mse_loss(output, target.to(output.device()));
  }

  std::vector<int64_t> sample_shape() const override { return sample_shape_; }

 private:
  uint64_t seed_;
  std::vector<int64_t> sample_shape_;
  std::vector<int64_t> output_shape_;
  torch::Tensor target_;
};

}  // namespace

Model load_torchscript(const std::string& path, const std::vector<int64_t>& sample_shape, uint64_t seed) {
  if (sample_shape.empty() || std::any_of(sample_shape.begin(), sample_shape.end(), [](int64_t d) { return d < 1; })) {
    throw SchemaError(c10::str("torchscript ", path, ": input shape must be one or more positive sizes, got [",
                               c10::Join(", ", sample_shape), "]"));
  }
  torch::jit::Module script;
  try {
    script = torch::jit::load(path, torch::kCPU);
  } catch (const c10::Error& e) {
    throw SchemaError(c10::str("torchscript ", path, ": cannot load: ", first_line(e.what_without_backtrace())));
  }
  Model model;
  model.name = "torchscript";
  for (const auto& child : script.named_children()) {
    model.units.push_back({child.name, type_name(child.value), std::make_shared<ScriptUnit>(child.value), {}});
  }
  if (model.units.empty()) {
    throw SchemaError(c10::str("torchscript ", path, ": the module (", type_name(script),
                               ") has no children to use as units; script an nn.Sequential whose children "
                               "are the units"));
  }
  // One forward of two zero samples in eval mode gives the output shape (and checks the input shape).
  std::vector<int64_t> probe_shape = {2};
  probe_shape.insert(probe_shape.end(), sample_shape.begin(), sample_shape.end());
  torch::Tensor output;
  try {
    torch::NoGradGuard no_grad;
    output = torch::zeros(probe_shape);
    for (Unit& unit : model.units) {
      unit.module->eval();
      output = unit.module->forward(output);
    }
  } catch (const c10::Error& e) {
    throw SchemaError(c10::str("torchscript ", path, ": forward of input shape [", c10::Join(", ", sample_shape),
                               "] failed: ", first_line(e.what_without_backtrace())));
  }
  for (Unit& unit : model.units) unit.module->train();
  std::vector<int64_t> output_shape(output.sizes().begin() + 1, output.sizes().end());
  model.task = std::make_unique<FixedTargetRegression>(seed, sample_shape, output_shape);
  return model;
}

}  // namespace zeroplan::zoo
