// The Plan's rules: what validate refuses, with the message that names the numbers.
#include <algorithm>

#include "plan_internal.h"
#include "zeroplan/profiles/model_profile.h"

namespace zeroplan {

using detail::is_dtype;
using detail::kMaxPrefetchBytes;
using detail::plan_error;
using detail::write_checkpointing;
using detail::write_loss_scale;

namespace {

// Batch identity, stage counts and ZeRO stage.
void validate_batch(const Plan& p) {
  auto at_least_one = [](const char* field, int v) {
    if (v < 1) plan_error(std::string(field) + " must be >= 1 (got " + num(v) + ")");
  };
  at_least_one("world_size", p.world_size);
  at_least_one("micro_batch", p.micro_batch);
  at_least_one("microbatches", p.microbatches);
  at_least_one("pipeline_stages", p.pipeline_stages);
  if (p.world_size % p.pipeline_stages != 0)
    plan_error("world_size " + num(p.world_size) + " is not a multiple of pipeline_stages " +
               num(p.pipeline_stages));
  const std::int64_t dp = p.data_parallel_size();
  const std::int64_t product = std::int64_t{p.micro_batch} * p.microbatches * dp;
  if (p.global_batch != product) {
    const std::string ranks = p.pipeline_stages == 1
                                  ? "world_size " + num(p.world_size)
                                  : "data-parallel size " + num(dp) + " (world_size " + num(p.world_size) +
                                        " / pipeline_stages " + num(p.pipeline_stages) + ")";
    plan_error("global_batch " + num(p.global_batch) + " != micro_batch " + num(p.micro_batch) +
               " x microbatches " + num(p.microbatches) + " x " + ranks + " (= " + num(product) + ")");
  }
  if (p.zero_stage < 0 || p.zero_stage > 3) plan_error("zero_stage must be 0, 1, 2 or 3 (got " + num(p.zero_stage) + ")");
  if (p.reshard_after_forward && p.zero_stage != 3)
    plan_error("reshard_after_forward requires zero_stage 3 (got " + num(p.zero_stage) + ")");
}

// Pipeline parallelism: schedule, checkpoint mode, balance, and what stages exclude.
void validate_pipeline(const Plan& p) {
  const Pipeline& pl = p.pipeline;
  if (pl.schedule != "gpipe" && pl.schedule != "1f1b")
    plan_error("pipeline.schedule must be \"gpipe\" or \"1f1b\" (got " + quote_json(pl.schedule) + ")");
  if (pl.checkpoint != "always" && pl.checkpoint != "except_last" && pl.checkpoint != "never")
    plan_error("pipeline.checkpoint must be \"always\", \"except_last\" or \"never\" (got " + quote_json(pl.checkpoint) + ")");
  if (pl.checkpoint != "never" && p.pipeline_stages == 1)
    plan_error("pipeline.checkpoint " + quote_json(pl.checkpoint) + " requires pipeline_stages > 1 (got 1)");
  if (pl.checkpoint != "never" && pl.schedule != "gpipe")
    plan_error("pipeline.checkpoint " + quote_json(pl.checkpoint) + " requires pipeline.schedule \"gpipe\" (got " +
               quote_json(pl.schedule) + "; checkpoint units with checkpointing instead)");
  if (pl.checkpoint != "never" && p.checkpointing.mode != Checkpointing::Mode::none)
    plan_error("pipeline.checkpoint " + quote_json(pl.checkpoint) + " and checkpointing " +
               write_checkpointing(p.checkpointing).dump() + " both recompute: set one of them to never / none");
  if (pl.balance.mode == PipelineBalance::Mode::units) {
    const std::vector<int>& b = pl.balance.units;
    if (static_cast<int>(b.size()) != p.pipeline_stages)
      plan_error("pipeline.balance has " + num(static_cast<std::int64_t>(b.size())) + " entries but pipeline_stages is " + num(p.pipeline_stages));
    for (std::size_t i = 0; i < b.size(); ++i)
      if (b[i] < 1) plan_error("pipeline.balance[" + num(static_cast<std::int64_t>(i)) + "] must be >= 1 (got " + num(b[i]) + ")");
  }
  if (p.pipeline_stages > 1 && p.zero_stage == 3)
    plan_error("pipeline_stages " + num(p.pipeline_stages) + " requires zero_stage 0, 1 or 2 (got 3)");
}

// Offload of model states and the activations ratio.
void validate_offload(const Plan& p) {
  if (p.offload.params && p.zero_stage != 3)
    plan_error("offload.params requires zero_stage 3 (got " + num(p.zero_stage) + ")");
  if (p.offload.optimizer && p.zero_stage < 1)
    plan_error("offload.optimizer requires zero_stage 1, 2 or 3 (got " + num(p.zero_stage) + ")");
  if (p.offload.grads && !p.offload.optimizer)
    plan_error("offload.grads requires offload.optimizer (the host optimizer consumes the gradients)");
  if (!(p.offload.activations_ratio >= 0 && p.offload.activations_ratio <= 1))
    plan_error("offload.activations_ratio must be in [0, 1] (got " + num(p.offload.activations_ratio) + ")");
  if (p.offload.activations_prefetch_bytes < -1 || p.offload.activations_prefetch_bytes > kMaxPrefetchBytes)
    plan_error("offload.activations_prefetch_bytes must be -1 (one unit) or in [0, 1e15] (got " +
               num(p.offload.activations_prefetch_bytes) + ")");
}

// fairscale OffloadModel: slices, chunks, and what it excludes.
void validate_offload_model(const Plan& p) {
  if (p.offload_model.enabled) {
    const OffloadModel& om = p.offload_model;
    if (om.slices < 1) plan_error("offload_model.slices must be >= 1 (got " + num(om.slices) + ")");
    if (om.microbatches < 1)
      plan_error("offload_model.microbatches must be >= 1 (got " + num(om.microbatches) + ")");
    if (p.micro_batch % om.microbatches != 0)
      plan_error("offload_model.microbatches " + num(om.microbatches) + " does not divide micro_batch " +
                 num(p.micro_batch));
    // Stage 0 also excludes offload.params/grads/optimizer, which need stage >= 1.
    if (p.zero_stage != 0)
      plan_error("offload_model requires zero_stage 0 (got " + num(p.zero_stage) + ")");
    if (p.pipeline_stages != 1)
      plan_error("offload_model requires pipeline_stages 1 (got " + num(p.pipeline_stages) + ")");
  }
}

// Activation checkpointing, its offload, and what OffloadModel excludes.
void validate_checkpointing(const Plan& p) {
  if (p.checkpointing.mode == Checkpointing::Mode::units) {
    const std::vector<int>& u = p.checkpointing.units;
    if (u.empty()) plan_error("checkpointing: empty list of units (use \"none\")");
    for (std::size_t i = 0; i < u.size(); ++i) {
      if (u[i] < 0) plan_error("checkpointing: unit index " + num(u[i]) + " is negative");
      if (i > 0 && u[i] <= u[i - 1])
        plan_error("checkpointing: unit indices must be strictly increasing (" + num(u[i - 1]) + " then " +
                   num(u[i]) + ")");
    }
  } else if (!p.checkpointing.units.empty()) {
    plan_error("checkpointing: unit list given with mode none or all");
  }
  if (p.checkpoint_offload && p.checkpointing.mode == Checkpointing::Mode::none)
    plan_error("checkpoint_offload requires checkpointing (got \"none\"): it offloads the checkpointed units' inputs");
  if (p.checkpoint_offload && p.offload_model.enabled)
    plan_error("checkpoint_offload requires offload_model off (OffloadModel keeps its own activations: "
               "offload_model.checkpoint_activation)");
  if (p.offload_model.enabled) {  // OffloadModel schedules its own activations and reduces every step
    if (p.checkpointing.mode != Checkpointing::Mode::none)
      plan_error("offload_model requires checkpointing none (OffloadModel checkpoints whole slices: "
                 "offload_model.checkpoint_activation)");
    if (p.offload.activations_ratio > 0)
      plan_error("offload_model requires offload.activations_ratio 0 (got " + num(p.offload.activations_ratio) +
                 "): OffloadModel keeps its own activations");
    if (p.localsgd() || p.adascale)
      plan_error(std::string("offload_model requires synchronous data parallelism (got ") +
                 (p.adascale ? "adascale" : "localsgd_frequency " + num(p.localsgd_frequency)) + ")");
  }
}

// LocalSGD and SlowMo.
void validate_localsgd(const Plan& p) {
  if (p.localsgd_frequency < 0)
    plan_error("localsgd_frequency must be >= 0 (got " + num(p.localsgd_frequency) + ")");
  if (p.localsgd() && p.zero_stage != 0)
    plan_error("localsgd_frequency " + num(p.localsgd_frequency) + " requires zero_stage 0 (got " +
               num(p.zero_stage) + ")");
  if (p.localsgd() && p.pipeline_stages != 1)
    plan_error("localsgd_frequency " + num(p.localsgd_frequency) + " requires pipeline_stages 1 (got " +
               num(p.pipeline_stages) + ")");
  if (p.localsgd_warmup_steps < 0)
    plan_error("localsgd_warmup_steps must be >= 0 (got " + num(p.localsgd_warmup_steps) + ")");
  if (p.localsgd_warmup_steps > 0 && !p.localsgd())
    plan_error("localsgd_warmup_steps " + num(p.localsgd_warmup_steps) + " requires localsgd_frequency > 1 (got " +
               num(p.localsgd_frequency) + ")");
  if (p.slowmo_frequency < 0)
    plan_error("slowmo_frequency must be >= 0 (got " + num(p.slowmo_frequency) + ")");
  if (!(p.slowmo_momentum >= 0 && p.slowmo_momentum < 1))
    plan_error("slowmo_momentum must be in [0, 1) (got " + num(p.slowmo_momentum) + ")");
  if (!(p.slowmo_lr > 0)) plan_error("slowmo_lr must be > 0 (got " + num(p.slowmo_lr) + ")");
  const std::string slow_lr = p.slowmo_lr != 1 ? ", slowmo_lr " + num(p.slowmo_lr) : "";
  if ((p.slowmo_frequency > 0 || p.slowmo_momentum != 0 || p.slowmo_lr != 1) && !p.localsgd())
    plan_error("slowmo (slowmo_frequency " + num(p.slowmo_frequency) + ", slowmo_momentum " +
               num(p.slowmo_momentum) + slow_lr + ") requires localsgd_frequency > 1 (got " +
               num(p.localsgd_frequency) + ")");
  if ((p.slowmo_momentum != 0 || p.slowmo_lr != 1) && p.slowmo_frequency == 0)
    plan_error("slowmo (slowmo_momentum " + num(p.slowmo_momentum) + slow_lr +
               ") requires slowmo_frequency > 0 (got 0): the slow update never runs");
}

// The optimizer and AdaScale.
void validate_optimizer(const Plan& p) {
  const Optimizer& o = p.optimizer;
  if (o.name != "adam" && o.name != "adamw" && o.name != "sgd")
    plan_error("optimizer.name must be \"adam\", \"adamw\" or \"sgd\" (got " + quote_json(o.name) + ")");
  if (!(o.lr > 0)) plan_error("optimizer.lr must be > 0 (got " + num(o.lr) + ")");
  if (!(o.eps > 0)) plan_error("optimizer.eps must be > 0 (got " + num(o.eps) + ")");
  if (!(o.weight_decay >= 0)) plan_error("optimizer.weight_decay must be >= 0 (got " + num(o.weight_decay) + ")");
  if (!(o.max_grad_norm >= 0)) plan_error("optimizer.max_grad_norm must be >= 0 (got " + num(o.max_grad_norm) + ")");
  if (o.max_grad_norm > 0 && p.localsgd())
    plan_error("optimizer.max_grad_norm " + num(o.max_grad_norm) + " with localsgd_frequency " + num(p.localsgd_frequency) +
               ": each replica steps on its own gradients, so there is no one norm to clip; clip each replica's "
               "gradients in your own loop");
  if (!(o.momentum >= 0 && o.momentum < 1))
    plan_error("optimizer.momentum must be in [0, 1) (got " + num(o.momentum) + ")");
  if (o.momentum != 0 && o.name != "sgd")
    plan_error("optimizer.momentum " + num(o.momentum) + " is only used by sgd (got " + quote_json(o.name) + ")");
  for (int i = 0; i < 2; ++i)
    if (!(o.betas[i] >= 0 && o.betas[i] < 1))
      plan_error("optimizer.betas[" + num(i) + "] must be in [0, 1) (got " + num(o.betas[i]) + ")");
  if (p.adascale && o.name != "sgd")
    plan_error("adascale requires optimizer sgd (got " + quote_json(o.name) + ")");
}

// Mixed precision, loss scaling and reduction dtypes.
void validate_precision(const Plan& p) {
  const Precision& pr = p.precision;
  for (const auto& [field, dtype] : {std::pair{"param_dtype", &pr.param_dtype}, std::pair{"compute_dtype", &pr.compute_dtype},
                                     std::pair{"reduce_dtype", &pr.reduce_dtype}})
    if (!is_dtype(*dtype))
      plan_error(std::string("precision.") + field + " must be \"fp32\", \"fp16\" or \"bf16\" (got " +
                 quote_json(*dtype) + ")");
  if (pr.loss_scale.mode != LossScale::Mode::none && pr.compute_dtype == "fp32")
    plan_error("precision.loss_scale " + write_loss_scale(pr.loss_scale).dump() +
               " requires compute_dtype fp16 or bf16 (got \"fp32\")");
  if (pr.loss_scale.mode == LossScale::Mode::fixed && !(pr.loss_scale.value > 0))
    plan_error("precision.loss_scale must be > 0 (got " + num(pr.loss_scale.value) + ")");
  if (pr.broadcast_fp16 && p.zero_stage != 1 && p.zero_stage != 2)
    plan_error("precision.broadcast_fp16 requires zero_stage 1 or 2 (got " + num(p.zero_stage) + ")");
  if (pr.fp32_reduce_scatter && p.zero_stage < 2)
    plan_error("precision.fp32_reduce_scatter requires zero_stage 2 or 3 (got " + num(p.zero_stage) + ")");
  if (pr.fp32_reduce_scatter && pr.reduce_dtype != "fp32")
    plan_error("precision.fp32_reduce_scatter requires reduce_dtype fp32 (got " + quote_json(pr.reduce_dtype) + ")");
}

// Bucket sizes.
void validate_buckets(const Plan& p) {
  const Buckets& b = p.buckets;
  for (const auto& [field, v] : {std::pair{"all_reduce_bucket_bytes", b.all_reduce_bucket_bytes},
                                 std::pair{"reduce_buffer_elems", b.reduce_buffer_elems},
                                 std::pair{"allgather_bucket_bytes", b.allgather_bucket_bytes}})
    if (v < 1) plan_error(std::string("buckets.") + field + " must be >= 1 (got " + num(v) + ")");
}

}  // namespace

void validate(const Plan& p) {
  validate_batch(p);
  validate_pipeline(p);
  validate_offload(p);
  validate_offload_model(p);
  validate_checkpointing(p);
  validate_localsgd(p);
  validate_optimizer(p);
  validate_precision(p);
  validate_buckets(p);
}

void validate(const Plan& p, const ModelProfile& model) {
  validate(p);
  const int entries = static_cast<int>(model.units.size());
  const int expanded = model.expanded_unit_count();
  if (p.checkpointing.mode == Checkpointing::Mode::units && !p.checkpointing.units.empty() &&
      p.checkpointing.units.back() >= entries)
    plan_error("checkpointing: unit index " + num(p.checkpointing.units.back()) + " but model " +
               quote_json(model.name) + " has " + num(entries) + " unit entries");
  if (p.offload_model.enabled && p.offload_model.slices > expanded)
    plan_error("offload_model.slices " + num(p.offload_model.slices) + " > " + num(expanded) + " units of model " +
               quote_json(model.name));
  if (p.pipeline_stages > expanded)
    plan_error("pipeline_stages " + num(p.pipeline_stages) + " > " + num(expanded) + " units of model " +
               quote_json(model.name));
  if (p.pipeline.balance.mode == PipelineBalance::Mode::units) {
    std::int64_t sum = 0;
    for (const int n : p.pipeline.balance.units) sum += n;
    if (sum != expanded)
      plan_error("pipeline.balance sums to " + num(sum) + " units but model " + quote_json(model.name) + " has " +
                 num(expanded));
  }
}

}  // namespace zeroplan
