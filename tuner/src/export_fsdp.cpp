// Accelerate FSDP configs: FSDP1 (fsdp_sharding_strategy) and FSDP2 (fsdp_version 2,
// fsdp_reshard_after_forward). Written as YAML text with a fixed key order.
#include <fmt/format.h>

#include "export_common.h"
#include "zeroplan/tuner/exports.h"

namespace zeroplan::tuner {
namespace {

// What both FSDP versions cannot express.
void common_unsupported(const Plan& p, const ModelProfile& model, const std::string& device_kind, Export& e) {
  auto& no = e.unsupported;
  if (device_kind == "cpu") no.emplace_back(kAccelerateNeedsAccelerators);
  if (p.zero_stage == 1) no.emplace_back("ZeRO stage 1 (optimizer state sharding only) has no FSDP sharding strategy");
  if (p.offload_model.enabled) no.emplace_back("fairscale OffloadModel (layer-by-layer slices) has no FSDP equivalent");
  if (p.localsgd())
    no.emplace_back("LocalSGD / SlowMo: FSDP reduces gradients every step, and accelerate.local_sgd.LocalSGD refuses FSDP "
                    "(DDP only) and has no slow momentum");
  if (p.offload.activations_ratio > 0)
    no.push_back(fmt::format("partial activation offload (ratio {}) has no Accelerate FSDP setting", p.offload.activations_ratio));
  const bool any = p.offload.params || p.offload.grads || p.offload.optimizer;
  const bool all = p.offload.params && p.offload.grads && p.offload.optimizer;
  if (any && !all)
    no.emplace_back("FSDP's offload_params moves parameters, gradients and the optimizer step to the host together; the plan "
                    "offloads only some of them");
  if (p.checkpointing.mode != Checkpointing::Mode::none && !exports::checkpoints_exactly_wrap_class(p, model))
    no.push_back(fmt::format("checkpointing {}: Accelerate checkpoints exactly the wrapped {} layers",
                             exports::checkpointing_text(p.checkpointing), wrap_class(model)));
  if (p.checkpoint_offload)
    no.emplace_back("checkpoint_offload: Accelerate's fsdp_activation_checkpointing keeps checkpointed inputs on the device");
  if (p.precision.broadcast_fp16) no.emplace_back("broadcast_fp16 (fairscale OSS) has no FSDP equivalent");
  if (p.adascale)
    no.emplace_back("AdaScale: Accelerate has no learning-rate gain, and fairscale's AdaScale reads full gradients, which FSDP "
                    "shards");
  if (p.pipeline_stages > 1) no.emplace_back("pipeline parallelism (GPipe / 1F1B stages) has no FSDP equivalent");
  if (p.precision.param_dtype != p.precision.compute_dtype)
    no.push_back(fmt::format("parameters in {} with compute in {}: FSDP computes in its parameter dtype",
                             p.precision.param_dtype, p.precision.compute_dtype));
  if (p.precision.param_dtype != "fp32" && !p.precision.master_fp32)
    no.emplace_back("16-bit parameters without an fp32 master copy: FSDP mixed precision always keeps fp32 parameters");
}

std::string mixed_precision(const Plan& p) { return p.precision.param_dtype == "fp32" ? "'no'" : p.precision.param_dtype; }

void common_notes(const Plan& p, Export& e) {
  if (p.zero_stage == 3 && p.prefetch_ahead() > 1)
    e.notes.push_back(fmt::format("the plan gathers {} units ahead: FSDP prefetches one; set it in code (FSDP2: "
                                  "set_modules_to_forward_prefetch / set_modules_to_backward_prefetch with the next {} units, "
                                  "as train_fsdp2.py does)",
                                  p.buckets.prefetch_depth, p.buckets.prefetch_depth));
  if (p.optimizer.max_grad_norm > 0)
    e.notes.push_back(fmt::format("gradient clipping is set in code: accelerator.clip_grad_norm_(model.parameters(), {}) "
                                  "before optimizer.step() (the norm over every shard)",
                                  p.optimizer.max_grad_norm));
  if (p.microbatches > 1)
    e.notes.push_back(fmt::format("gradient accumulation is set in code: Accelerator(gradient_accumulation_plugin="
                                  "GradientAccumulationPlugin(num_steps={}, sync_each_batch={})) with a per-device batch of {}{}",
                                  p.microbatches, p.zero_stage >= 2 ? "True" : "False", p.micro_batch,
                                  p.zero_stage >= 2 ? " (the plan reduce-scatters every microbatch, as fairscale does)" : ""));
  if (p.precision.param_dtype != "fp32" && p.precision.reduce_dtype != p.precision.param_dtype)
    e.notes.push_back(fmt::format("the plan reduces gradients in {}: set the FSDP plugin's mixed precision policy "
                                  "reduce_dtype accordingly in code (Accelerate's '{}' reduces in {})",
                                  p.precision.reduce_dtype, p.precision.param_dtype, p.precision.param_dtype));
  if (p.zero_stage == 2)
    e.notes.emplace_back("ZeRO stage 2 maps to not resharding after forward (SHARD_GRAD_OP): FSDP gathers the parameters in "
                         "forward and frees them after backward where stage 2 all-gathers after the step; same traffic, same "
                         "peak");
}

std::string machine_block(const Plan& p, int nodes) {
  return fmt::format(
      "machine_rank: 0\n"
      "main_training_function: main\n"
      "mixed_precision: {}\n"
      "num_machines: {}\n"
      "num_processes: {}\n"
      "rdzv_backend: static\n"
      "same_network: true\n"
      "tpu_env: []\n"
      "tpu_use_cluster: false\n"
      "tpu_use_sudo: false\n"
      "use_cpu: false\n",  // true would launch without FSDP (accelerate launch: --use_fsdp and not --cpu)
      mixed_precision(p), nodes, p.world_size);
}

std::string header(const Plan& p) {
  return fmt::format("# Accelerate config written by zeroplan tune for: {}\n", exports::plan_summary(p));
}

std::string b(bool v) { return v ? "true" : "false"; }

}  // namespace

Export export_accelerate_fsdp(const Plan& p, const ModelProfile& model, int nodes, const std::string& device_kind) {
  Export e;
  e.tool = "Accelerate FSDP1";
  e.file = "accelerate_fsdp.yaml";
  common_unsupported(p, model, device_kind, e);
  if (!e.expressible()) return e;
  common_notes(p, e);
  // 1 FULL_SHARD (stage 3, reshard), 2 SHARD_GRAD_OP (stage 3 without reshard, stage 2), 3 NO_SHARD (DDP).
  const int strategy = p.zero_stage == 0 ? 3 : (p.zero_stage == 3 && p.reshard_after_forward ? 1 : 2);
  const bool ckpt = p.checkpointing.mode != Checkpointing::Mode::none;
  e.text = header(p) + fmt::format(
                           "compute_environment: LOCAL_MACHINE\n"
                           "debug: false\n"
                           "distributed_type: FSDP\n"
                           "downcast_bf16: 'no'\n"
                           "enable_cpu_affinity: false\n"
                           "fsdp_config:\n"
                           "  fsdp_activation_checkpointing: {}\n"
                           "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                           "  fsdp_backward_prefetch: {}\n"
                           "  fsdp_cpu_ram_efficient_loading: true\n"
                           "  fsdp_forward_prefetch: {}\n"
                           "  fsdp_offload_params: {}\n"
                           "  fsdp_sharding_strategy: {}\n"
                           "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
                           "  fsdp_sync_module_states: true\n"
                           "  fsdp_transformer_layer_cls_to_wrap: {}\n"
                           "  fsdp_use_orig_params: {}\n"
                           "  fsdp_version: 1\n",
                           b(ckpt), p.buckets.prefetch ? "BACKWARD_PRE" : "NO_PREFETCH", b(p.buckets.prefetch && p.zero_stage == 3),
                           b(p.offload.params), strategy, wrap_class(model), b(!p.flat_params)) +
           machine_block(p, nodes);
  e.notes.push_back(fmt::format("fsdp_transformer_layer_cls_to_wrap is the profile's unit type \"{}\": use your model's class "
                                "name for that block",
                                wrap_class(model)));
  return e;
}

Export export_accelerate_fsdp2(const Plan& p, const ModelProfile& model, int nodes, const std::string& device_kind) {
  Export e;
  e.tool = "Accelerate FSDP2";
  e.file = "accelerate_fsdp2.yaml";
  if (p.zero_stage == 0) e.unsupported.emplace_back("plain data parallel (stage 0): FSDP2 always shards; use DDP");
  common_unsupported(p, model, device_kind, e);
  if (!e.expressible()) return e;
  common_notes(p, e);
  if (p.flat_params)
    e.notes.emplace_back("FSDP2 shards each parameter (no flat parameter): the optimizer steps per tensor (use a foreach or "
                         "fused optimizer to get close to the plan's flat step)");
  if (!p.buckets.prefetch) e.notes.emplace_back("FSDP2 always prefetches the next unit; the plan does not");
  const bool ckpt = p.checkpointing.mode != Checkpointing::Mode::none;
  e.text = header(p) + fmt::format(
                           "compute_environment: LOCAL_MACHINE\n"
                           "debug: false\n"
                           "distributed_type: FSDP\n"
                           "downcast_bf16: 'no'\n"
                           "enable_cpu_affinity: false\n"
                           "fsdp_config:\n"
                           "  fsdp_activation_checkpointing: {}\n"
                           "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                           "  fsdp_cpu_ram_efficient_loading: true\n"
                           "  fsdp_offload_params: {}\n"
                           "  fsdp_reshard_after_forward: {}\n"
                           "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
                           "  fsdp_transformer_layer_cls_to_wrap: {}\n"
                           "  fsdp_version: 2\n",
                           b(ckpt), b(p.offload.params), b(p.zero_stage == 3 && p.reshard_after_forward), wrap_class(model)) +
           machine_block(p, nodes);
  e.notes.push_back(fmt::format("fsdp_transformer_layer_cls_to_wrap is the profile's unit type \"{}\": use your model's class "
                                "name for that block",
                                wrap_class(model)));
  return e;
}

}  // namespace zeroplan::tuner
