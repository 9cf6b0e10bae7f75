// Exports of a plan to the configs of the tools people already use. Where a tool cannot express the
// plan, the export says so (`unsupported`) and no config is written, rather than one that differs.
#pragma once

#include <string>
#include <vector>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/profiles/prediction.h"

namespace zeroplan::tuner {

struct Export {
  std::string tool;        // "zeroplan", "DeepSpeed", "Accelerate FSDP1", "Accelerate FSDP2", "fairscale"
  std::string file;        // "plan.json", "ds_config.json", "accelerate_fsdp.yaml", "accelerate_fsdp2.yaml", "fairscale.py"
  std::string text;        // the file's content ("" when unsupported is not empty)
  std::vector<std::string> notes;        // what to do beside the config (model code, launcher flags)
  std::vector<std::string> unsupported;  // parts of the plan the tool cannot express

  bool expressible() const { return unsupported.empty(); }
};

// The zeroplan Plan document (to_json_string).
Export export_plan(const Plan& plan);

// DeepSpeed ds_config.json, every value written out: train_batch_size = micro x
// gradient_accumulation_steps x world (asserted), zero_optimization (stage, bucket sizes in elements,
// offload_optimizer {device, pin_memory, ratio}, offload_param at stage 3), fp16 / bf16, optimizer.
Export export_deepspeed(const Plan& plan, const ModelProfile& model);

// Device bytes per rank a tool holds all step beyond what zeroplan predicts for its own executor on `plan`,
// measured (python.exports, docs/2): DeepSpeed's ZeRO-3 without optimizer offload keeps a flat gradient
// partition in the parameters' dtype all step (grad_partitions_flat_buffer: ceil(params / data-parallel ranks)
// elements), with contiguous_gradients (flat_params) a gradient bucket of one unit, and in fp32 a second fp32
// parameter partition for its optimizer (fp32_partitioned_groups_flat). 0 for every other tool and plan:
// DeepSpeed's stages 1-2 in fp32 peaked under zeroplan's prediction; fp16 and offloaded optimizers are not
// measured, so not claimed. The DeepSpeed export's notes list the parts.
std::int64_t tool_device_bytes_beyond_prediction(const std::string& tool, const Plan& plan, const ModelProfile& model);
// The name of those bytes in a prediction's resident list.
inline constexpr const char* kDeepSpeedPartitionsName = "DeepSpeed's own ZeRO-3 partitions";
// Adds them to `p`'s device peak, as a resident item (largest first) and a note, and returns them; nothing
// (0) when there are none. tune --for TOOL predicts with them (with_tool_memory, evaluator.h), and so does
// simulate --for TOOL.
std::int64_t add_tool_memory(Prediction& p, const std::string& tool, const Plan& plan, const ModelProfile& model);

// The tools of --for (tune and simulate), each with an export.
inline const std::vector<std::string>& export_tools() {
  static const std::vector<std::string> tools{"deepspeed", "fsdp2", "accelerate", "fairscale", "zeroplan"};
  return tools;
}

// Accelerate config for FSDP1 (fsdp_sharding_strategy 1 FULL_SHARD / 2 SHARD_GRAD_OP / 3 NO_SHARD,
// fsdp_offload_params, fsdp_auto_wrap_policy, fsdp_transformer_layer_cls_to_wrap, ...), for a cluster whose
// devices are of `device_kind` (ClusterProfile::device.kind): none on "cpu" (kAccelerateNeedsAccelerators).
Export export_accelerate_fsdp(const Plan& plan, const ModelProfile& model, int nodes, const std::string& device_kind);
// Accelerate config for FSDP2 (fsdp_version: 2, fsdp_reshard_after_forward, ...); none on "cpu" either.
Export export_accelerate_fsdp2(const Plan& plan, const ModelProfile& model, int nodes, const std::string& device_kind);
// Why Accelerate's FSDP cannot run on CPUs (accelerate 1.15): `accelerate launch` starts FSDP only when not
// --cpu, and a process that then finds no accelerator initializes no process group (DistributedType.NO):
// every rank would train its own unsharded copy. With use_cpu it launches MULTI_CPU, which is never FSDP.
inline constexpr const char* kAccelerateNeedsAccelerators =
    "Accelerate runs FSDP on accelerators only: on a cluster of CPUs each process of `accelerate launch` would "
    "train its own unsharded copy (DistributedType.NO), and use_cpu launches plain data parallel without FSDP";

// A plain-PyTorch training script, train_fsdp2.py, run under torchrun with the user's model factory
// (FILE.py:FACTORY -> model, make_batch, loss_fn): fully_shard on each module of the profile's repeated
// unit classes then on the root (stage 3 resharding after forward as the plan says, stage 2 not), with
// MixedPrecisionPolicy(param_dtype, reduce_dtype) for 16-bit plans and CPUOffloadPolicy when the plan
// offloads parameters, gradients and the optimizer; DistributedDataParallel at stage 0, with
// ZeroRedundancyOptimizer at stage 1; checkpoint_wrapper (non-reentrant) on those modules when the plan
// checkpoints exactly them; the plan's optimizer, micro batch and accumulation; --record writes a
// RunRecord through zeroplan.record for `compare`.
Export export_fsdp2_script(const Plan& plan, const ModelProfile& model);
// The unit types that repeat in the profile (the layers FSDP wraps one by one), or wrap_class alone.
std::vector<std::string> repeated_unit_classes(const ModelProfile& model);

// A Python snippet wrapping a model and optimizer with fairscale (OSS, ShardedDataParallel,
// FullyShardedDataParallel, OffloadModel, SlowMoDistributedDataParallel) with the plan's arguments.
Export export_fairscale(const Plan& plan, const ModelProfile& model, int devices_per_node);

// True when `tool` ("deepspeed", "fsdp2", "accelerate", "fairscale", "zeroplan", "" = any) can express
// the plan: its export writes a config (Export::expressible; accelerate: FSDP1 or FSDP2).
bool expressible_by(const std::string& tool, const Plan& plan, const ModelProfile& model, const ClusterProfile& cluster);

// All of the above, in that order, for a cluster of `nodes` nodes of `devices_per_node` devices of `device_kind`.
std::vector<Export> export_all(const Plan& plan, const ModelProfile& model, int nodes, int devices_per_node,
                               const std::string& device_kind);

// The class to wrap: the type of the unit with the most parameters x count ("TransformerBlock").
std::string wrap_class(const ModelProfile& model);

}  // namespace zeroplan::tuner
