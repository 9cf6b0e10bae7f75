#include <algorithm>
#include "text.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/profiles/knobs.h"
#include "zeroplan/tuner/exports.h"

namespace zeroplan::tuner {

Export export_plan(const Plan& plan) {
  Export e;
  e.tool = "zeroplan";
  e.file = "plan.json";
  e.text = to_json_string(plan);
  const std::vector<std::string> not_run = unsupported_knobs(plan, Component::run);
  if (not_run.empty() && plan.pipeline_stages > 1 && plan.pipeline.balance.mode != PipelineBalance::Mode::units)
    e.notes.emplace_back("zeroplan simulate --plan plan.json predicts it; zeroplan run --plan plan.json --profile "
                         "PROFILE runs it (the model's profile splits the units into stages as simulate does)");
  else if (not_run.empty())
    e.notes.emplace_back("zeroplan simulate --plan plan.json predicts it; zeroplan run --plan plan.json runs it");
  else
    e.notes.push_back("zeroplan simulate --plan plan.json predicts it; zeroplan run does not run it yet (" +
                      text::join(not_run) + ")");
  return e;
}

bool expressible_by(const std::string& tool, const Plan& plan, const ModelProfile& model, const ClusterProfile& cluster) {
  if (tool.empty() || tool == "zeroplan") return true;
  const int per_node = std::max(1, cluster.devices_per_node);
  const int nodes = (plan.world_size + per_node - 1) / per_node;
  if (tool == "deepspeed") return export_deepspeed(plan, model).expressible();
  if (tool == "fsdp2") return export_fsdp2_script(plan, model).expressible();
  if (tool == "accelerate")
    return export_accelerate_fsdp(plan, model, nodes, cluster.device.kind).expressible() ||
           export_accelerate_fsdp2(plan, model, nodes, cluster.device.kind).expressible();
  if (tool == "fairscale") return export_fairscale(plan, model, per_node).expressible();
  return false;
}

std::vector<Export> export_all(const Plan& plan, const ModelProfile& model, int nodes, int devices_per_node,
                               const std::string& device_kind) {
  return {export_plan(plan), export_deepspeed(plan, model), export_accelerate_fsdp(plan, model, nodes, device_kind),
          export_accelerate_fsdp2(plan, model, nodes, device_kind), export_fsdp2_script(plan, model),
          export_fairscale(plan, model, devices_per_node)};
}

}  // namespace zeroplan::tuner
