// The model registry: names, descriptions, options and presets; option checking; shared helpers.
#include "zoo_impl.h"

#include <zeroplan/profiles/errors.h>

#include <ATen/CPUGeneratorImpl.h>

#include <charconv>
#include <cmath>

namespace zeroplan::zoo {

int64_t Model::parameter_count() const {
  int64_t total = 0;
  for (const Unit& unit : units) {
    for (const torch::Tensor& p : unit.module->parameters()) total += p.numel();
  }
  return total;
}

const std::vector<ModelInfo>& registered_models() {
  static const std::vector<ModelInfo> models = {detail::gpt_info(), detail::mlp_info(),
                                                detail::resnet_info()};
  return models;
}

namespace {

std::string list_names(const std::vector<std::string>& names) {
  return names.empty() ? std::string("none") : c10::Join(", ", names);
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const ModelInfo& info : registered_models()) names.push_back(info.name);
  return names;
}

std::vector<std::string> option_names(const ModelInfo& info) {
  std::vector<std::string> names;
  for (const OptionInfo& option : info.options) names.push_back(option.name);
  return names;
}

}  // namespace

const ModelInfo& model_info(const std::string& name) {
  for (const ModelInfo& info : registered_models()) {
    if (info.name == name) return info;
  }
  throw SchemaError(c10::str("unknown model \"", name, "\" (models: ", list_names(model_names()), ")"));
}

Options resolve_options(const std::string& name, const std::string& preset, const Options& overrides) {
  const ModelInfo& info = model_info(name);
  Options resolved;
  for (const OptionInfo& option : info.options) resolved[option.name] = option.default_value;
  auto apply = [&](const Options& options) {
    for (const auto& [key, value] : options) {
      if (!resolved.contains(key)) {
        throw SchemaError(c10::str("model ", name, ": unknown option \"", key, "\" (options: ",
                                   list_names(option_names(info)), ")"));
      }
      resolved[key] = value;
    }
  };
  if (!preset.empty()) {
    auto it = info.presets.find(preset);
    if (it == info.presets.end()) {
      std::vector<std::string> presets;
      for (const auto& [preset_name, options] : info.presets) presets.push_back(preset_name);
      throw SchemaError(c10::str("model ", name, ": unknown preset \"", preset, "\" (presets: ",
                                 list_names(presets), ")"));
    }
    apply(it->second);
  }
  apply(overrides);
  return resolved;
}

void check_options(const std::string& name, const std::string& preset, const Options& overrides) {
  const Options options = resolve_options(name, preset, overrides);
  if (name == "mlp") {
    detail::build_mlp(options, 0, true);
  } else if (name == "gpt") {
    detail::build_gpt(options, 0, true);
  } else if (name == "resnet") {
    detail::build_resnet(options, 0, true);
  }
}

Model build_model(const std::string& name, const std::string& preset, const Options& overrides,
                  uint64_t seed) {
  Options options = resolve_options(name, preset, overrides);
  Model model;
  {
    detail::DefaultGeneratorGuard guard;
    torch::NoGradGuard no_grad;
    if (name == "mlp") {
      model = detail::build_mlp(options, seed);
    } else if (name == "gpt") {
      model = detail::build_gpt(options, seed);
    } else if (name == "resnet") {
      model = detail::build_resnet(options, seed);
    } else {
      TORCH_INTERNAL_ASSERT(false, "model ", name, " is registered but has no builder");
    }
  }
  model.name = name;
  model.preset = preset;
  for (Unit& unit : model.units) unit.module->train();
  return model;
}

namespace detail {

namespace {

const std::string& raw_option(const std::string& model, const Options& options, const std::string& name) {
  auto it = options.find(name);
  TORCH_INTERNAL_ASSERT(it != options.end(), "model ", model, ": option ", name, " was not resolved");
  return it->second;
}

}  // namespace

int64_t int_option(const std::string& model, const Options& options, const std::string& name,
                   int64_t min_value) {
  const std::string& text = raw_option(model, options, name);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min_value) {
    throw SchemaError(c10::str("model ", model, ": option ", name, " must be an integer >= ", min_value,
                               ", got \"", text, "\""));
  }
  return value;
}

double double_option(const std::string& model, const Options& options, const std::string& name,
                     double min_value, double max_value) {
  const std::string& text = raw_option(model, options, name);
  double value = 0.0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !(value >= min_value && value <= max_value)) {
    throw SchemaError(c10::str("model ", model, ": option ", name, " must be a number in [", min_value,
                               ", ", max_value, "], got \"", text, "\""));
  }
  return value;
}

bool bool_option(const std::string& model, const Options& options, const std::string& name) {
  const std::string& text = raw_option(model, options, name);
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off") return false;
  throw SchemaError(
      c10::str("model ", model, ": option ", name, " must be true or false, got \"", text, "\""));
}

std::string choice_option(const std::string& model, const Options& options, const std::string& name,
                          const std::vector<std::string>& choices) {
  const std::string& text = raw_option(model, options, name);
  for (const std::string& choice : choices) {
    if (choice == text) return text;
  }
  throw SchemaError(c10::str("model ", model, ": option ", name, " must be one of ",
                             list_names(choices), ", got \"", text, "\""));
}

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = 0.0;
  do {
    u1 = uniform();
  } while (u1 <= 0.0);
  const double u2 = uniform();
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * M_PI * u2;
  spare_ = radius * std::sin(angle);
  has_spare_ = true;
  return radius * std::cos(angle);
}

namespace {
at::Generator default_cpu_generator() { return at::detail::getDefaultCPUGenerator(); }  // a shared handle
}  // namespace

DefaultGeneratorGuard::DefaultGeneratorGuard() : state_(default_cpu_generator().get_state()) {}

DefaultGeneratorGuard::~DefaultGeneratorGuard() { default_cpu_generator().set_state(state_); }

at::Generator param_generator(uint64_t seed) { return at::detail::createCPUGenerator(mix64(seed)); }

void init_linear_default(torch::nn::LinearImpl& linear, at::Generator& gen) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(linear.options.in_features()));
  linear.weight.uniform_(-bound, bound, gen);
  if (linear.bias.defined()) linear.bias.uniform_(-bound, bound, gen);
}

}  // namespace detail
}  // namespace zeroplan::zoo
