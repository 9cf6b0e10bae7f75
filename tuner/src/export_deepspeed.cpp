// DeepSpeed ds_config.json. Every value is written out (DeepSpeed's defaults differ between its docs and
// its code); what DeepSpeed cannot express is listed instead of approximated.
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <nlohmann/json.hpp>

#include "export_common.h"
#include "text.h"
#include "zeroplan/profiles/pipeline.h"
#include "zeroplan/tuner/exports.h"

namespace zeroplan::tuner {
namespace {

using ojson = nlohmann::ordered_json;

// DeepSpeed's offload_optimizer.ratio: the share of optimizer state on the host. zeroplan offloads all of
// it or none, so 1; DeepSpeed accepts a ratio below 1 only at stage 3 (checked where it is written).
double offload_ratio(const Plan&) { return 1.0; }

// What DeepSpeed cannot express of the plan (empty: the config runs it). `partition` gets the pipeline's
// partition_method when the plan has stages.
std::vector<std::string> deepspeed_gaps(const Plan& p, const ModelProfile& model, std::string& partition) {
  std::vector<std::string> no;
  if (p.offload_model.enabled) no.emplace_back("fairscale OffloadModel (layer-by-layer slices) has no DeepSpeed equivalent");
  if (p.localsgd())
    no.emplace_back("LocalSGD / SlowMo: DeepSpeed's engine reduces gradients across all ranks every step; it has no periodic "
                    "parameter averaging or slow momentum");
  if (p.offload.activations_ratio > 0)
    no.push_back(fmt::format("partial activation offload (ratio {}) has no DeepSpeed setting; activation_checkpointing."
                             "cpu_checkpointing offloads checkpoints, which is a different plan",
                             p.offload.activations_ratio));
  if (p.offload.optimizer && !p.offload.grads)
    no.emplace_back("offload_optimizer also moves the gradients to the host; the plan keeps them on the device");
  if (p.offload.optimizer && p.optimizer.name == "sgd")
    no.emplace_back("DeepSpeed's host optimizers are Adam, Adagrad and Lion; the plan offloads SGD");
  if (p.precision.broadcast_fp16) no.emplace_back("broadcast_fp16 (fairscale OSS) has no DeepSpeed equivalent");
  if (p.adascale)
    no.emplace_back("AdaScale: DeepSpeed's engine steps its own optimizer and has no gradient-variance learning-rate gain");
  if (p.precision.param_dtype != p.precision.compute_dtype)
    no.push_back(fmt::format("parameters in {} with compute in {}: DeepSpeed computes in its parameter dtype",
                             p.precision.param_dtype, p.precision.compute_dtype));
  if (p.precision.param_dtype != "fp32" && !p.precision.master_fp32)
    no.emplace_back("16-bit parameters without an fp32 master copy: DeepSpeed always keeps one");
  if (p.precision.param_dtype == "bf16" && p.precision.loss_scale.mode != LossScale::Mode::none)
    no.emplace_back("loss scaling with bf16: DeepSpeed's bf16 mode does not scale the loss");
  if (p.precision.param_dtype == "fp16" && p.precision.loss_scale.mode == LossScale::Mode::none)
    no.emplace_back("fp16 without loss scaling: DeepSpeed's fp16 mode always scales the loss");
  // Pipelines: DeepSpeed's PipelineEngine (1F1B, ZeRO 0-1), its layers split by PipelineModule.
  if (p.pipeline_stages > 1) {
    if (p.zero_stage >= 2)
      no.push_back(fmt::format("DeepSpeed's PipelineEngine runs ZeRO stages 0-1 only (plan: stage {}): it accumulates "
                               "gradients over the microbatches, which ZeRO-2's partitioned reduction in every backward breaks",
                               p.zero_stage));
    if (p.pipeline.schedule != "1f1b")
      no.emplace_back("DeepSpeed's PipelineEngine runs its 1F1B TrainSchedule only; the plan's schedule is gpipe");
    const std::vector<int> balance = pipeline_balance(p, model);
    const std::vector<int> uniform = exports::deepspeed_uniform_partition(model.expanded_unit_count(), p.pipeline_stages);
    if (balance == uniform) partition = "uniform";
    else
      no.push_back(fmt::format("balance [{}] is not DeepSpeed's partition_method \"uniform\" ([{}]); its \"parameters\" "
                               "and \"type:\" methods balance other weights",
                               fmt::join(balance, ","), fmt::join(uniform, ",")));
  }
  if (p.offload.optimizer && offload_ratio(p) < 1 && p.zero_stage != 3)
    no.push_back(fmt::format("offload_optimizer ratio {} < 1 needs ZeRO stage 3 (plan: stage {})", offload_ratio(p), p.zero_stage));
  return no;
}

// "optimizer" (or, for SGD, the client optimizer the user passes, in a note).
void optimizer_section(const Plan& p, ojson& j, std::vector<std::string>& notes) {
  if (p.optimizer.name == "sgd") {
    notes.push_back(fmt::format("DeepSpeed has no built-in SGD: pass torch.optim.SGD(params, lr={}, momentum={}, "
                                  "weight_decay={}) as the client optimizer to deepspeed.initialize",
                                  p.optimizer.lr, p.optimizer.momentum, p.optimizer.weight_decay));
    j["zero_allow_untested_optimizer"] = true;
  } else {
    ojson params;
    params["lr"] = p.optimizer.lr;
    params["betas"] = {p.optimizer.betas[0], p.optimizer.betas[1]};
    params["eps"] = p.optimizer.eps;
    params["weight_decay"] = p.optimizer.weight_decay;
    params["adam_w_mode"] = p.optimizer.name == "adamw";
    j["optimizer"] = {{"type", p.optimizer.name == "adamw" ? "AdamW" : "Adam"}, {"params", params}};
    j["zero_allow_untested_optimizer"] = false;
  }
}

// "fp16" and "bf16": zeroplan's dynamic loss scale as DeepSpeed's.
void precision_section(const Plan& p, ojson& j) {
  const bool fp16 = p.precision.param_dtype == "fp16";
  ojson f16;
  f16["enabled"] = fp16;
  f16["auto_cast"] = false;
  f16["loss_scale"] = fp16 && p.precision.loss_scale.mode == LossScale::Mode::fixed ? p.precision.loss_scale.value : 0.0;
  f16["initial_scale_power"] = 16;
  f16["loss_scale_window"] = 2000;  // zeroplan's dynamic scale: x2 after 2000 clean steps
  f16["hysteresis"] = 1;            // and x0.5 at the first overflow
  f16["consecutive_hysteresis"] = false;
  f16["min_loss_scale"] = 1;
  j["fp16"] = f16;
  j["bf16"] = {{"enabled", p.precision.param_dtype == "bf16"}};
}

// "zero_optimization": the stage, the buckets (in elements), the offloads and stage 3's residency.
ojson zero_section(const Plan& p, const ModelProfile& model) {
  const int grad_bytes = exports::dtype_bytes(p.precision.reduce_dtype);
  const int param_bytes = exports::dtype_bytes(p.precision.param_dtype);
  const std::int64_t unit = std::max<std::int64_t>(1, exports::largest_unit_params(model));
  std::int64_t reduce_bucket = 0;
  if (p.zero_stage <= 1) reduce_bucket = p.buckets.all_reduce_bucket_bytes / grad_bytes;
  else if (p.zero_stage == 2) reduce_bucket = p.buckets.reduce_buffer_elems;
  else reduce_bucket = unit;  // stage 3 reduce-scatters one unit at a time
  ojson z;
  z["stage"] = p.zero_stage;
  z["contiguous_gradients"] = p.flat_params;
  z["overlap_comm"] = true;
  z["reduce_scatter"] = true;
  z["reduce_bucket_size"] = reduce_bucket;
  z["allgather_partitions"] = true;
  z["allgather_bucket_size"] = p.buckets.allgather_bucket_bytes / param_bytes;
  z["round_robin_gradients"] = false;
  ojson oo;
  oo["device"] = p.offload.optimizer ? "cpu" : "none";
  oo["pin_memory"] = p.offload.optimizer;
  oo["ratio"] = offload_ratio(p);
  oo["buffer_count"] = 4;
  oo["fast_init"] = false;
  z["offload_optimizer"] = oo;
  if (p.zero_stage == 3) {
    ojson op;
    op["device"] = p.offload.params ? "cpu" : "none";
    op["pin_memory"] = p.offload.params;
    op["buffer_count"] = 5;
    op["buffer_size"] = 100000000;
    op["max_in_cpu"] = 1000000000;
    z["offload_param"] = op;
    const std::int64_t total = std::max<std::int64_t>(1, model.total_params());
    // Prefetch prefetch_depth units ahead, or none; keep gathered parameters until backward unless resharding.
    z["stage3_prefetch_bucket_size"] = unit * p.prefetch_ahead();
    z["stage3_param_persistence_threshold"] = 0;  // every parameter is sharded, as in the plan
    z["stage3_max_live_parameters"] = total;
    z["stage3_max_reuse_distance"] = p.reshard_after_forward ? 0 : total;
    z["sub_group_size"] = 1000000000;
    z["stage3_gather_16bit_weights_on_model_save"] = false;
  }
  return z;
}

// "activation_checkpointing": where the checkpoints live (the checkpointed units are in the model code).
ojson activation_checkpointing_section(const Plan& p) {
  ojson ac;
  ac["partition_activations"] = false;
  ac["cpu_checkpointing"] = p.checkpoint_offload;
  ac["contiguous_memory_optimization"] = false;
  ac["number_checkpoints"] = nullptr;
  ac["synchronize_checkpoint_boundary"] = false;
  ac["profile"] = false;
  return ac;
}

// What DeepSpeed's ZeRO-3 (stage3.py) holds all step that zeroplan's executor does not, measured on its CPU
// accelerator (python.exports, docs/2): its flat gradient partition in the parameters' dtype
// (grad_partitions_flat_buffer), with contiguous_gradients its gradient bucket of reduce_bucket_size elements
// (ipg bucket.buffer), and in fp32 a second fp32 parameter partition for its optimizer
// (fp32_partitioned_groups_flat). Nothing where it was not measured: stages 1-2 (under the prediction in
// fp32), fp16, an offloaded optimizer.
struct DeepSpeedHeld {
  std::int64_t gradients = 0;  // the flat gradient partition, in the parameters' dtype
  std::int64_t bucket = 0;     // contiguous_gradients: stage 3's reduce bucket, one unit (zero_section)
  std::int64_t fp32_copy = 0;  // fp32 only: the optimizer's own parameter partition
  std::int64_t total() const { return gradients + bucket + fp32_copy; }
};
DeepSpeedHeld deepspeed_held_beyond_prediction(const Plan& p, const ModelProfile& model) {
  const std::string& dtype = p.precision.param_dtype;
  if (p.zero_stage != 3 || p.offload.optimizer || (dtype != "fp32" && dtype != "bf16")) return {};
  const std::int64_t dp = p.data_parallel_size();
  const std::int64_t elems = (model.total_params() + dp - 1) / dp;
  const int bytes = exports::dtype_bytes(dtype);
  DeepSpeedHeld held;
  held.gradients = elems * bytes;
  if (p.flat_params) held.bucket = std::max<std::int64_t>(1, exports::largest_unit_params(model)) * bytes;
  if (dtype == "fp32") held.fp32_copy = elems * 4;
  return held;
}

// What the user does around the config: checkpointing in the model, the pipeline module, the launch.
std::vector<std::string> deepspeed_notes(const Plan& p, const ModelProfile& model, const std::string& partition,
                                         std::int64_t train_batch) {
  const int dp = p.data_parallel_size();
  std::vector<std::string> notes;
  if (p.checkpointing.mode != Checkpointing::Mode::none)
    notes.push_back(fmt::format("activation checkpointing ({}) lives in the model code: wrap those units' forward in "
                                  "deepspeed.checkpointing.checkpoint{}",
                                  exports::checkpointing_text(p.checkpointing),
                                  p.checkpoint_offload ? " (cpu_checkpointing keeps each checkpointed input on the host)" : ""));
  if (!p.flat_params && p.zero_stage >= 1)
    notes.emplace_back("DeepSpeed's ZeRO optimizer always steps on flat partitions; the plan's per-tensor step is slower, "
                         "so DeepSpeed will be a little faster than predicted");
  if (const DeepSpeedHeld held = deepspeed_held_beyond_prediction(p, model); held.total() > 0) {
    std::vector<std::string> parts{fmt::format("its flat {} gradient partition ({})", p.precision.param_dtype,
                                               text::bytes(held.gradients))};
    if (held.bucket > 0) parts.push_back(fmt::format("its contiguous gradient bucket ({})", text::bytes(held.bucket)));
    if (held.fp32_copy > 0)
      parts.push_back(fmt::format("a second fp32 parameter partition for its optimizer ({})", text::bytes(held.fp32_copy)));
    notes.push_back(fmt::format("memory: DeepSpeed's ZeRO-3 holds {} ({} B) per rank that zeroplan's own executor does not, "
                                  "all step: {}. tune --for deepspeed counts them in its prediction (\"{}\" in "
                                  "tune.json's device peak), and so does `zeroplan simulate --for deepspeed` of "
                                  "plan.json (without --for it predicts zeroplan's executor)",
                                  text::bytes(held.total()), held.total(), fmt::join(parts, ", "), kDeepSpeedPartitionsName));
    if (p.prefetch_ahead() > 0)
      notes.emplace_back("memory: DeepSpeed's prefetch (stage3_prefetch_bucket_size) held more gathered parameters "
                         "than zeroplan's prefetch of the next unit: 2.6 units more on a 3-layer Llama (python.exports' "
                         "model, fp32 and bf16), not counted in the prediction; leave headroom or set the bucket to 0");
  }
  if (p.pipeline_stages > 1) {
    notes.push_back(fmt::format("pipeline: model = deepspeed.pipe.PipelineModule(layers=units, num_stages={}, "
                                  "partition_method=\"{}\", loss_fn=loss_fn, activation_checkpoint_interval={}) over the "
                                  "{} units, then engine.train_batch() runs gradient_accumulation_steps {} microbatches "
                                  "through the stages (1F1B)",
                                  p.pipeline_stages, partition, p.checkpointing.mode == Checkpointing::Mode::all ? 1 : 0,
                                  model.expanded_unit_count(), p.microbatches));
    notes.push_back(fmt::format("launch with {} ranks ({} stages x data-parallel {}): train_batch_size {} = micro {} x "
                                  "gradient_accumulation_steps {} x data-parallel {}",
                                  p.world_size, p.pipeline_stages, dp, train_batch, p.micro_batch, p.microbatches, dp));
  } else {
    notes.push_back(fmt::format("launch with {} ranks: train_batch_size {} = micro {} x gradient_accumulation_steps {} x world {}",
                                  p.world_size, train_batch, p.micro_batch, p.microbatches, p.world_size));
  }
  return notes;
}

}  // namespace

std::int64_t tool_device_bytes_beyond_prediction(const std::string& tool, const Plan& p, const ModelProfile& model) {
  return tool == "deepspeed" ? deepspeed_held_beyond_prediction(p, model).total() : 0;
}

std::int64_t add_tool_memory(Prediction& pred, const std::string& tool, const Plan& plan, const ModelProfile& model) {
  const std::int64_t extra = tool_device_bytes_beyond_prediction(tool, plan, model);
  if (extra <= 0) return 0;
  pred.device.peak_bytes += extra;
  auto& r = pred.device.resident;
  r.insert(std::find_if(r.begin(), r.end(), [&](const ResidentItem& i) { return i.bytes < extra; }),
           ResidentItem{"optimizer", kDeepSpeedPartitionsName, extra});
  pred.notes.push_back(fmt::format("--for {}: the device peak counts what DeepSpeed holds beyond zeroplan's executor, "
                                   "{} of \"{}\"", tool, text::bytes(extra), kDeepSpeedPartitionsName));
  return extra;
}

Export export_deepspeed(const Plan& p, const ModelProfile& model) {
  Export e;
  e.tool = "DeepSpeed";
  e.file = "ds_config.json";
  std::string partition;
  e.unsupported = deepspeed_gaps(p, model, partition);
  if (!e.expressible()) return e;

  // Batch identity, as DeepSpeed asserts it.
  const int dp = p.data_parallel_size();  // DeepSpeed: world / pipeline stages
  const std::int64_t train_batch = static_cast<std::int64_t>(p.micro_batch) * p.microbatches * dp;
  if (train_batch != p.global_batch)  // validate(plan) guarantees it: a broken invariant
    throw std::logic_error(fmt::format("ds_config: train_batch_size {} != micro {} x accumulation {} x data-parallel {}",
                                       p.global_batch, p.micro_batch, p.microbatches, dp));
  ojson j;
  j["train_batch_size"] = train_batch;
  j["train_micro_batch_size_per_gpu"] = p.micro_batch;
  j["gradient_accumulation_steps"] = p.microbatches;
  j["gradient_clipping"] = p.optimizer.max_grad_norm;
  j["prescale_gradients"] = false;
  j["gradient_predivide_factor"] = 1.0;
  j["steps_per_print"] = 100;
  j["wall_clock_breakdown"] = false;
  j["communication_data_type"] = p.precision.fp32_reduce_scatter ? std::string("fp32") : p.precision.reduce_dtype;
  optimizer_section(p, j, e.notes);
  precision_section(p, j);
  j["zero_optimization"] = zero_section(p, model);
  j["activation_checkpointing"] = activation_checkpointing_section(p);
  for (std::string& note : deepspeed_notes(p, model, partition, train_batch)) e.notes.push_back(std::move(note));
  e.text = j.dump(2) + "\n";
  return e;
}

}  // namespace zeroplan::tuner
