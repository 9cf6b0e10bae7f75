#include "export_common.h"

#include <fmt/format.h>

#include "text.h"
#include "zeroplan/tuner/exports.h"

namespace zeroplan::tuner {
namespace exports {

int dtype_bytes(const std::string& dtype) { return dtype == "fp32" ? 4 : 2; }

std::int64_t largest_unit_params(const ModelProfile& model) {
  std::int64_t m = 0;
  for (const UnitProfile& u : model.units) m = std::max(m, u.params);
  return m;
}

bool checkpoints_exactly_wrap_class(const Plan& plan, const ModelProfile& model) {
  const std::string cls = wrap_class(model);
  for (int i = 0; i < static_cast<int>(model.units.size()); ++i) {
    const bool is_cls = model.units[static_cast<std::size_t>(i)].type == cls;
    if (plan.checkpointing.applies_to(i) != is_cls) return false;
  }
  return true;
}

std::string checkpointing_text(const Checkpointing& c) {
  switch (c.mode) {
    case Checkpointing::Mode::none: return "none";
    case Checkpointing::Mode::all: return "all";
    case Checkpointing::Mode::units: {
      std::vector<std::string> u;
      for (int i : c.units) u.push_back(std::to_string(i));
      return "units [" + text::join(u, ",") + "]";
    }
  }
  return "?";
}

std::vector<int> deepspeed_uniform_partition(int items, int parts) {
  std::vector<int> out(static_cast<std::size_t>(parts), 0);
  if (items <= parts) {
    for (int i = 0; i < items; ++i) out[static_cast<std::size_t>(i)] = 1;
    return out;
  }
  for (int i = 0; i < parts; ++i) out[static_cast<std::size_t>(i)] = items / parts + (i < items % parts ? 1 : 0);
  return out;
}

std::string pipeline_text(const Plan& p) {
  if (p.pipeline_stages <= 1) return "off";
  std::string s = fmt::format("{} stages, {}", p.pipeline_stages, p.pipeline.schedule);
  if (p.pipeline.checkpoint != "never") s += ", checkpoint " + p.pipeline.checkpoint;
  const PipelineBalance& b = p.pipeline.balance;
  if (b.mode == PipelineBalance::Mode::memory) s += ", balance by memory";
  if (b.mode == PipelineBalance::Mode::units) {
    std::vector<std::string> u;
    for (int n : b.units) u.push_back(std::to_string(n));
    s += ", balance [" + text::join(u, ",") + "]";
  }
  return s;
}

std::string plan_summary(const Plan& p) {
  std::vector<std::string> parts;
  parts.push_back(fmt::format("zero_stage {}", p.zero_stage));
  if (p.zero_stage == 3) parts.push_back(p.reshard_after_forward ? "reshard_after_forward" : "no reshard");
  parts.push_back(fmt::format("world {}, micro_batch {} x {} microbatches", p.world_size, p.micro_batch, p.microbatches));
  parts.push_back(precision_name(p.precision));
  std::vector<std::string> off;
  if (p.offload.params) off.emplace_back("params");
  if (p.offload.grads) off.emplace_back("grads");
  if (p.offload.optimizer) off.emplace_back("optimizer");
  if (p.offload.activations_ratio > 0) off.push_back(fmt::format("activations {}", p.offload.activations_ratio));
  if (!off.empty()) parts.push_back("offload " + text::join(off, "+"));
  if (p.offload_model.enabled) parts.push_back(fmt::format("OffloadModel {} slices", p.offload_model.slices));
  if (p.pipeline_stages > 1) parts.push_back("pipeline " + pipeline_text(p));
  if (p.checkpointing.mode != Checkpointing::Mode::none)
    parts.push_back("checkpointing " + checkpointing_text(p.checkpointing) + (p.checkpoint_offload ? " (inputs on the host)" : ""));
  if (p.localsgd()) {
    std::string l = fmt::format("localsgd every {}", p.localsgd_frequency);
    if (p.localsgd_warmup_steps > 0) l += fmt::format(" after {} synchronous steps", p.localsgd_warmup_steps);
    if (p.slowmo())
      l += fmt::format(", slowmo every {} (momentum {}, lr {})", p.slowmo_frequency, p.slowmo_momentum, p.slowmo_lr);
    parts.push_back(std::move(l));
  }
  if (p.adascale) parts.emplace_back("AdaScale");
  if (p.flat_params) parts.emplace_back("flat params");
  return text::join(parts);
}

}  // namespace exports

std::string wrap_class(const ModelProfile& model) {
  const UnitProfile* best = nullptr;
  for (const UnitProfile& u : model.units)
    if (!best || u.params * u.count > best->params * best->count) best = &u;
  return best ? best->type : std::string();
}

}  // namespace zeroplan::tuner
