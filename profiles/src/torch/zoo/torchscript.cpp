// TorchScript models: the top-level children of a scripted module are the units. Each child's
// parameters and buffers are registered, as the same tensors, on a UnitModule wrapper, so
// parameters(), to() and set_data() on the wrapper act on what the script computes with.
#include "zoo_impl.h"

#include <zeroplan/profiles/errors.h>

#include <torch/script.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <sstream>

namespace zeroplan::zoo {
namespace {

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
  // `borrowed`: dotted names of parameters another (earlier) unit owns: used, not registered.
  explicit ScriptUnit(torch::jit::Module script, const std::set<std::string>& borrowed = {})
      : script_(std::move(script)) {
    std::set<std::string> used;
    for (const auto& p : script_.named_parameters(/*recurse=*/true)) {
      if (borrowed.contains(p.name)) continue;
      registered_.emplace_back(p.value, unique_name(p.name, used));
      register_parameter(registered_.back().second, p.value, p.value.requires_grad());
    }
    for (const auto& b : script_.named_buffers(/*recurse=*/true)) {
      register_buffer(unique_name(b.name, used), b.value);
    }
  }
  // A child that writes its input in place would modify the previous unit's output (which autograd may
  // have saved) or a leaf that requires grad: it computes on a copy instead.
  torch::Tensor forward(const torch::Tensor& input) override {
    return script_.forward({copy_input_ ? input.clone() : input}).toTensor();
  }
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    script_.train(on);
  }
  void set_copy_input(bool on) { copy_input_ = on; }
  // The name `p` is registered under ("" when this unit does not own it).
  std::string registered_name(const torch::Tensor& p) const {
    for (const auto& [t, name] : registered_)
      if (t.is_same(p)) return name;
    return "";
  }

 private:
  std::vector<std::pair<torch::Tensor, std::string>> registered_;
  torch::jit::Module script_;
  bool copy_input_ = false;
};

// A parameter's identity across TorchScript attributes: two attributes that were one tensor when scripted
// load as two tensors on one storage (same data pointer, offset, sizes and strides).
using ParamKey = std::tuple<const void*, int64_t, std::vector<int64_t>, std::vector<int64_t>>;
ParamKey param_key(const torch::Tensor& t) {
  return {t.storage().data(), t.storage_offset(), t.sizes().vec(), t.strides().vec()};
}

// Sets the parameter at dotted `name` of `module` to `value` (the same tensor object, so what the owner's
// unit puts in it, set_data on a flat buffer included, is what this module computes with).
void set_parameter(torch::jit::Module module, const std::string& name, const torch::Tensor& value) {
  std::string rest = name;
  for (auto dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
    module = module.attr(rest.substr(0, dot)).toModule();
    rest = rest.substr(dot + 1);
  }
  module.setattr(rest, value);
}

std::string type_name(const torch::jit::Module& module) {
  const auto& qualified = module.type()->name();
  return qualified ? qualified->name() : std::string("ScriptModule");
}

std::vector<int64_t> with_batch(int64_t count, const std::vector<int64_t>& shape) {
  std::vector<int64_t> out = {count};
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

// A tensor of `shape` filled with N(0, 1) values from Rng(key): the tasks' fixed targets and prototypes.
torch::Tensor normal_tensor(const std::vector<int64_t>& shape, uint64_t key) {
  torch::Tensor t = torch::empty(shape, torch::kFloat32);
  detail::Rng rng(key);
  float* v = t.data_ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<float>(rng.normal());
  return t;
}

// Samples [first, first + count) of `step`: sample j draws from Rng(sample_key(seed, step, j)), first
// `base(rng, j)` (the values the noise is added to, or nullptr for none), then N(0, 1) noise per value.
template <class Base>
torch::Tensor noisy_samples(uint64_t seed, int64_t step, int64_t first, int64_t count,
                            const std::vector<int64_t>& sample_shape, Base&& base) {
  torch::Tensor input = torch::empty(with_batch(count, sample_shape), torch::kFloat32);
  const int64_t per_sample = input.numel() / count;
  float* x = input.data_ptr<float>();
  for (int64_t j = 0; j < count; ++j) {
    detail::Rng rng(detail::sample_key(seed, step, first + j));
    const float* b = base(rng, j);
    for (int64_t i = 0; i < per_sample; ++i) {
      x[j * per_sample + i] = (b != nullptr ? b[i] : 0.0f) + static_cast<float>(rng.normal());
    }
  }
  return input;
}

// Regress every sample's output onto one fixed N(0, 1) target (from the seed); inputs are N(0, 1),
// generated one by one from Rng(sample_key(seed, step, j)).
class FixedTargetRegression : public Task {
 public:
  FixedTargetRegression(uint64_t seed, std::vector<int64_t> sample_shape, std::vector<int64_t> output_shape)
      : seed_(seed),
        sample_shape_(std::move(sample_shape)),
        output_shape_(std::move(output_shape)),
        target_(normal_tensor(output_shape_, detail::teacher_key(seed))) {}

  Batch batch(int64_t step, int64_t first_sample, int64_t count) const override {
    TORCH_CHECK(step >= 0 && first_sample >= 0 && count >= 1, "torchscript task: bad batch request");
    torch::Tensor input = noisy_samples(seed_, step, first_sample, count, sample_shape_,
                                        [](detail::Rng&, int64_t) -> const float* { return nullptr; });
    return {input, target_.unsqueeze(0).expand(with_batch(count, output_shape_)).contiguous()};
  }

  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const override {
    return torch::mse_loss(output, target.to(output.device()));
  }

  std::vector<int64_t> sample_shape() const override { return sample_shape_; }
  bool batches_in_background() const override { return true; }

 private:
  uint64_t seed_;
  std::vector<int64_t> sample_shape_;
  std::vector<int64_t> output_shape_;
  torch::Tensor target_;
};

// Class c has a fixed N(0, 1) prototype of the sample shape (from the seed); a sample of class c is the
// prototype plus N(0, 1) noise. Samples one by one from Rng(sample_key(seed, step, j)): class, then noise.
class PrototypeClassification : public Task {
 public:
  PrototypeClassification(uint64_t seed, std::vector<int64_t> sample_shape, int64_t classes)
      : seed_(seed),
        sample_shape_(std::move(sample_shape)),
        classes_(classes),
        prototypes_(normal_tensor(with_batch(classes, sample_shape_), detail::teacher_key(seed))) {}

  Batch batch(int64_t step, int64_t first_sample, int64_t count) const override {
    TORCH_CHECK(step >= 0 && first_sample >= 0 && count >= 1, "torchscript task: bad batch request");
    torch::Tensor target = torch::empty({count}, torch::kInt64);
    int64_t* t = target.data_ptr<int64_t>();
    const float* p = prototypes_.data_ptr<float>();
    const int64_t per_sample = prototypes_.numel() / classes_;
    torch::Tensor input = noisy_samples(seed_, step, first_sample, count, sample_shape_,
                                        [&](detail::Rng& rng, int64_t j) {
                                          t[j] = rng.below(classes_);
                                          return p + t[j] * per_sample;
                                        });
    return {input, target};
  }

  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const override {
    return torch::nn::functional::cross_entropy(output, target.to(output.device()));
  }

  std::vector<int64_t> sample_shape() const override { return sample_shape_; }
  bool batches_in_background() const override { return true; }

 private:
  uint64_t seed_;
  std::vector<int64_t> sample_shape_;
  int64_t classes_;
  torch::Tensor prototypes_;  // classes x sample shape
};

std::string shape_text(c10::IntArrayRef shape) { return c10::str("[", c10::Join(", ", shape), "]"); }

// zeroplan runs a scripted module's children in order and never calls its forward(): a module whose
// forward() is something else (a skip across children, a reordering) would train another model than the
// user's. Refused: the forward of a random batch, in eval mode, must equal the chain's.
void check_forward_is_chain(const std::string& path, torch::jit::Module& script, Model& model,
                            const std::vector<int64_t>& sample_shape, const ScriptTask& task, uint64_t seed) {
  if (!script.find_method("forward")) return;
  torch::NoGradGuard no_grad;
  detail::DefaultGeneratorGuard keep_generator;
  torch::manual_seed(static_cast<uint64_t>(detail::teacher_key(seed)));
  const auto shape = with_batch(2, sample_shape);
  const torch::Tensor input = task.kind == "lm" ? torch::randint(0, task.vocab, shape, torch::kInt64) : torch::randn(shape);
  script.eval();
  torch::Tensor chain = input;
  for (Unit& unit : model.units) chain = unit.module->forward(chain);
  torch::Tensor whole;
  try {
    whole = script.forward({input}).toTensor();
  } catch (const std::exception& e) {
    throw SchemaError(c10::str("torchscript ", path, ": its forward() fails where the chain of its children runs (",
                               torch_cause(e), "): zeroplan runs the children in order; script an nn.Sequential whose "
                               "children are the units, or give the model with --python FILE.py:FACTORY"));
  }
  script.train();
  const bool same_shape = whole.sizes() == chain.sizes();
  const double diff = same_shape ? (whole.to(torch::kFloat64) - chain.to(torch::kFloat64)).abs().max().item<double>() : 0;
  const double scale = same_shape ? chain.to(torch::kFloat64).abs().max().item<double>() : 0;
  if (!same_shape || diff > 1e-4 * std::max(1.0, scale)) {
    throw SchemaError(c10::str(
        "torchscript ", path, ": the module's forward() is not the chain of its children (",
        same_shape ? c10::str("outputs differ by up to ", diff, " on a random batch") :
                     c10::str("output ", shape_text(whole.sizes()), " against the chain's ", shape_text(chain.sizes())),
        "): zeroplan runs the children in order and would train another model; script an nn.Sequential whose "
        "children are the units, or give the model with --python FILE.py:FACTORY"));
  }
}

}  // namespace

std::string torch_cause(const std::exception& error) {
  std::string text;
  if (const auto* c = dynamic_cast<const c10::Error*>(&error)) {
    text = c->what_without_backtrace();
  } else {
    text = error.what();
  }
  // TorchScript: "The following operation failed in the TorchScript interpreter. ... RuntimeError: cause".
  std::istringstream lines(text);
  std::string line, first, exception_line;
  while (std::getline(lines, line)) {
    if (first.empty() && !line.empty()) first = line;
    const auto colon = line.find("Error: ");
    if (colon != std::string::npos && line.find(' ') > colon) exception_line = line;
  }
  if (!exception_line.empty() && first.find("TorchScript interpreter") != std::string::npos) return exception_line;
  return first;
}

const std::vector<std::pair<std::string, std::string>>& script_task_kinds() {
  static const std::vector<std::pair<std::string, std::string>> kinds = {
      {"regress", "MSE of the output onto one fixed random target"},
      {"classify", "cross-entropy over --classes N: noisy copies of a fixed random prototype per class"},
      {"lm", "integer tokens in [0, --vocab V): next token of a fixed random Markov chain, cross-entropy"},
  };
  return kinds;
}

Model load_torchscript(const std::string& path, const std::vector<int64_t>& sample_shape, uint64_t seed,
                       const ScriptTask& task) {
  if (sample_shape.empty() || std::any_of(sample_shape.begin(), sample_shape.end(), [](int64_t d) { return d < 1; })) {
    throw SchemaError(c10::str("torchscript ", path, ": input shape must be one or more positive sizes, got [",
                               c10::Join(", ", sample_shape), "]"));
  }
  const auto& kinds = script_task_kinds();
  if (std::none_of(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == task.kind; })) {
    throw SchemaError(c10::str("torchscript ", path, ": unknown task \"", task.kind, "\" (tasks: regress, classify, lm)"));
  }
  if (task.kind == "classify" && task.classes < 2) {
    throw SchemaError(c10::str("torchscript ", path, ": task classify needs --classes >= 2, got ", task.classes));
  }
  if (task.kind == "lm" && (task.vocab < 2 || sample_shape.size() != 1)) {
    throw SchemaError(c10::str("torchscript ", path, ": task lm needs --vocab >= 2 (got ", task.vocab,
                               ") and a token input shape [T] (got ", shape_text(sample_shape), ")"));
  }
  torch::jit::Module script;
  try {
    script = torch::jit::load(path, torch::kCPU);
  } catch (const std::exception& e) {
    throw SchemaError(c10::str("torchscript ", path, ": cannot load: ", torch_cause(e)));
  }
  Model model;
  model.name = "torchscript";
  std::vector<std::shared_ptr<ScriptUnit>> units;
  // A parameter shared by two children (a tied embedding and head) stays one tensor: the first child
  // owns it, a later one borrows it (Unit::borrowed) and computes with the owner's tensor.
  std::map<ParamKey, std::pair<int, torch::Tensor>> owners;
  for (const auto& child : script.named_children()) {
    const int index = static_cast<int>(units.size());
    std::set<std::string> borrowed_names;
    std::vector<std::pair<int, torch::Tensor>> borrowed;
    for (const auto& p : child.value.named_parameters(/*recurse=*/true)) {
      auto [it, fresh] = owners.try_emplace(param_key(p.value), index, p.value);
      if (fresh || it->second.first == index) continue;
      set_parameter(child.value, p.name, it->second.second);
      borrowed_names.insert(p.name);
      borrowed.push_back(it->second);
    }
    units.push_back(std::make_shared<ScriptUnit>(child.value, borrowed_names));
    model.units.push_back({child.name, type_name(child.value), units.back(), {}});
    for (const auto& [owner, tensor] : borrowed)
      model.units.back().borrowed.push_back({owner, units[static_cast<std::size_t>(owner)]->registered_name(tensor)});
  }
  if (model.units.empty()) {
    throw SchemaError(c10::str("torchscript ", path, ": the module (", type_name(script),
                               ") has no children to use as units; script an nn.Sequential whose children "
                               "are the units"));
  }
  // One forward of two zero samples in eval mode gives the output shape and checks the input shape.
  // Each unit's input is a leaf that requires grad, as in the executor: a child that writes its input
  // in place fails there and is given a copy of its input from then on.
  const bool tokens = task.kind == "lm";
  torch::Tensor output = torch::zeros(with_batch(2, sample_shape), tokens ? torch::kInt64 : torch::kFloat32);
  for (std::size_t i = 0; i < model.units.size(); ++i) {
    Unit& unit = model.units[i];
    unit.module->eval();
    torch::Tensor input = output.is_floating_point() ? output.detach().requires_grad_() : output;
    try {
      try {
        output = unit.module->forward(input);
      } catch (const c10::Error& e) {
        if (std::string(e.what_without_backtrace()).find("in-place operation") == std::string::npos) throw;
        units[i]->set_copy_input(true);
        unit.type += " (copies its input: writes it in place)";
        output = unit.module->forward(input);
      }
    } catch (const std::exception& e) {
      throw SchemaError(c10::str("torchscript ", path, ": child ", unit.name, " (", unit.type, ") failed on input ",
                                 shape_text(input.sizes()), ": ", torch_cause(e)));
    }
  }
  check_forward_is_chain(path, script, model, sample_shape, task, seed);
  for (Unit& unit : model.units) unit.module->train();
  std::vector<int64_t> output_shape(output.sizes().begin() + 1, output.sizes().end());
  if (task.kind == "classify") {
    if (output_shape != std::vector<int64_t>{task.classes}) {
      throw SchemaError(c10::str("torchscript ", path, ": task classify with --classes ", task.classes,
                                 " needs an output [batch, ", task.classes, "], got ", shape_text(output.sizes())));
    }
    model.task = std::make_unique<PrototypeClassification>(seed, sample_shape, task.classes);
  } else if (task.kind == "lm") {
    if (output_shape != std::vector<int64_t>{sample_shape[0], task.vocab}) {
      throw SchemaError(c10::str("torchscript ", path, ": task lm with --vocab ", task.vocab, " needs an output [batch, ",
                                 sample_shape[0], ", ", task.vocab, "], got ", shape_text(output.sizes())));
    }
    model.task = detail::make_markov_language(seed, task.vocab, sample_shape[0]);
  } else {
    model.task = std::make_unique<FixedTargetRegression>(seed, sample_shape, output_shape);
  }
  return model;
}

}  // namespace zeroplan::zoo
