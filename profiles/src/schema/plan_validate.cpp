// The Plan's rules: what validate refuses, with the message that names the numbers.
#include <algorithm>

#include "plan_internal.h"
#include "zeroplan/profiles/model_profile.h"

namespace zeroplan {

using detail::is_dtype;
using detail::kMaxPrefetchBytes;
using detail::kPlanWhere;
using detail::plan_error;
using detail::write_checkpointing;
using detail::write_loss_scale;

// ---- single fields: ranges and names --------------------------------------------------------------

void validate_fields(const Plan& p) {
  auto at_least_one = [](const char* field, int v) {
    if (v < 1) plan_error(std::string(field) + " must be >= 1 (got " + num(v) + ")");
  };
  at_least_one("world_size", p.world_size);
  at_least_one("micro_batch", p.micro_batch);
  at_least_one("microbatches", p.microbatches);
  at_least_one("pipeline_stages", p.pipeline_stages);
  if (p.zero_stage < 0 || p.zero_stage > 3) plan_error("zero_stage must be 0, 1, 2 or 3 (got " + num(p.zero_stage) + ")");
  const Pipeline& pl = p.pipeline;
  if (pl.schedule != "gpipe" && pl.schedule != "1f1b")
    plan_error("pipeline.schedule must be \"gpipe\" or \"1f1b\" (got " + quote_json(pl.schedule) + ")");
  if (pl.checkpoint != "always" && pl.checkpoint != "except_last" && pl.checkpoint != "never")
    plan_error("pipeline.checkpoint must be \"always\", \"except_last\" or \"never\" (got " + quote_json(pl.checkpoint) + ")");
  if (pl.balance.mode == PipelineBalance::Mode::units) {
    const std::vector<int>& b = pl.balance.units;
    for (std::size_t i = 0; i < b.size(); ++i)
      if (b[i] < 1) plan_error("pipeline.balance[" + num(static_cast<std::int64_t>(i)) + "] must be >= 1 (got " + num(b[i]) + ")");
  }
  if (!(p.offload.activations_ratio >= 0 && p.offload.activations_ratio <= 1))
    plan_error("offload.activations_ratio must be in [0, 1] (got " + num(p.offload.activations_ratio) + ")");
  if (p.offload.activations_prefetch_bytes < -1 || p.offload.activations_prefetch_bytes > kMaxPrefetchBytes)
    plan_error("offload.activations_prefetch_bytes must be -1 (one tensor) or in [0, 1e15] (got " +
               num(p.offload.activations_prefetch_bytes) + ")");
  if (p.offload_model.enabled) {
    if (p.offload_model.slices < 1) plan_error("offload_model.slices must be >= 1 (got " + num(p.offload_model.slices) + ")");
    if (p.offload_model.microbatches < 1)
      plan_error("offload_model.microbatches must be >= 1 (got " + num(p.offload_model.microbatches) + ")");
  }
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
  if (p.localsgd_frequency < 0) plan_error("localsgd_frequency must be >= 0 (got " + num(p.localsgd_frequency) + ")");
  if (p.localsgd_warmup_steps < 0)
    plan_error("localsgd_warmup_steps must be >= 0 (got " + num(p.localsgd_warmup_steps) + ")");
  if (p.slowmo_frequency < 0) plan_error("slowmo_frequency must be >= 0 (got " + num(p.slowmo_frequency) + ")");
  if (!(p.slowmo_momentum >= 0 && p.slowmo_momentum < 1))
    plan_error("slowmo_momentum must be in [0, 1) (got " + num(p.slowmo_momentum) + ")");
  if (!(p.slowmo_lr > 0)) plan_error("slowmo_lr must be > 0 (got " + num(p.slowmo_lr) + ")");
  const Optimizer& o = p.optimizer;
  if (o.name != "adam" && o.name != "adamw" && o.name != "sgd")
    plan_error("optimizer.name must be \"adam\", \"adamw\" or \"sgd\" (got " + quote_json(o.name) + ")");
  if (!(o.lr > 0)) plan_error("optimizer.lr must be > 0 (got " + num(o.lr) + ")");
  if (!(o.eps > 0)) plan_error("optimizer.eps must be > 0 (got " + num(o.eps) + ")");
  if (!(o.weight_decay >= 0)) plan_error("optimizer.weight_decay must be >= 0 (got " + num(o.weight_decay) + ")");
  if (!(o.max_grad_norm >= 0)) plan_error("optimizer.max_grad_norm must be >= 0 (got " + num(o.max_grad_norm) + ")");
  if (!(o.momentum >= 0 && o.momentum < 1))
    plan_error("optimizer.momentum must be in [0, 1) (got " + num(o.momentum) + ")");
  for (int i = 0; i < 2; ++i)
    if (!(o.betas[i] >= 0 && o.betas[i] < 1))
      plan_error("optimizer.betas[" + num(i) + "] must be in [0, 1) (got " + num(o.betas[i]) + ")");
  const Precision& pr = p.precision;
  for (const auto& [field, dtype] : {std::pair{"param_dtype", &pr.param_dtype}, std::pair{"compute_dtype", &pr.compute_dtype},
                                     std::pair{"reduce_dtype", &pr.reduce_dtype}})
    if (!is_dtype(*dtype))
      plan_error(std::string("precision.") + field + " must be \"fp32\", \"fp16\" or \"bf16\" (got " +
                 quote_json(*dtype) + ")");
  if (pr.loss_scale.mode == LossScale::Mode::fixed && !(pr.loss_scale.value > 0))
    plan_error("precision.loss_scale must be > 0 (got " + num(pr.loss_scale.value) + ")");
  const Buckets& b = p.buckets;
  for (const auto& [field, v] : {std::pair{"all_reduce_bucket_bytes", b.all_reduce_bucket_bytes},
                                 std::pair{"reduce_buffer_elems", b.reduce_buffer_elems},
                                 std::pair{"allgather_bucket_bytes", b.allgather_bucket_bytes}})
    if (v < 1) plan_error(std::string("buckets.") + field + " must be >= 1 (got " + num(v) + ")");
  if (b.prefetch_depth < 1) plan_error("buckets.prefetch_depth must be >= 1 (got " + num(b.prefetch_depth) + ")");
}

namespace {

// ---- rules between knobs: each once, with the knobs it reads ---------------------------------------

std::string ok() { return {}; }
std::string localsgd_name(const Plan& p) { return "localsgd_frequency " + num(p.localsgd_frequency); }

std::vector<PlanRule> build_rules() {
  std::vector<PlanRule> r;
  auto rule = [&r](std::vector<std::string> knobs, std::function<std::string(const Plan&)> broken) {
    r.push_back(PlanRule{std::move(knobs), std::move(broken)});
  };
  // The batch split.
  rule({"world_size", "pipeline_stages"}, [](const Plan& p) {
    return p.world_size % p.pipeline_stages != 0 ? "world_size " + num(p.world_size) + " is not a multiple of pipeline_stages " +
                                                       num(p.pipeline_stages)
                                                 : ok();
  });
  rule({"global_batch", "micro_batch", "microbatches", "world_size", "pipeline_stages"}, [](const Plan& p) {
    const std::int64_t dp = p.data_parallel_size();
    const std::int64_t product = std::int64_t{p.micro_batch} * p.microbatches * dp;
    if (p.global_batch == product) return ok();
    const std::string ranks = p.pipeline_stages == 1 ? "world_size " + num(p.world_size)
                                                     : "data-parallel size " + num(dp) + " (world_size " + num(p.world_size) +
                                                           " / pipeline_stages " + num(p.pipeline_stages) + ")";
    return "global_batch " + num(p.global_batch) + " != micro_batch " + num(p.micro_batch) + " x microbatches " +
           num(p.microbatches) + " x " + ranks + " (= " + num(product) + ")";
  });
  rule({"reshard_after_forward", "zero_stage"}, [](const Plan& p) {
    return p.reshard_after_forward && p.zero_stage != 3 ? "reshard_after_forward requires zero_stage 3 (got " + num(p.zero_stage) + ")"
                                                        : ok();
  });
  // Pipelines.
  rule({"pipeline.checkpoint", "pipeline_stages"}, [](const Plan& p) {
    return p.pipeline.checkpoint != "never" && p.pipeline_stages == 1
               ? "pipeline.checkpoint " + quote_json(p.pipeline.checkpoint) + " requires pipeline_stages > 1 (got 1)"
               : ok();
  });
  rule({"pipeline.checkpoint", "pipeline.schedule"}, [](const Plan& p) {
    return p.pipeline.checkpoint != "never" && p.pipeline.schedule != "gpipe"
               ? "pipeline.checkpoint " + quote_json(p.pipeline.checkpoint) + " requires pipeline.schedule \"gpipe\" (got " +
                     quote_json(p.pipeline.schedule) + "; checkpoint units with checkpointing instead)"
               : ok();
  });
  rule({"pipeline.checkpoint", "checkpointing"}, [](const Plan& p) {
    return p.pipeline.checkpoint != "never" && p.checkpointing.mode != Checkpointing::Mode::none
               ? "pipeline.checkpoint " + quote_json(p.pipeline.checkpoint) + " and checkpointing " +
                     write_checkpointing(p.checkpointing).dump() + " both recompute: set one of them to never / none"
               : ok();
  });
  rule({"pipeline.balance", "pipeline_stages"}, [](const Plan& p) {
    const PipelineBalance& b = p.pipeline.balance;
    return b.mode == PipelineBalance::Mode::units && static_cast<int>(b.units.size()) != p.pipeline_stages
               ? "pipeline.balance has " + num(static_cast<std::int64_t>(b.units.size())) + " entries but pipeline_stages is " +
                     num(p.pipeline_stages)
               : ok();
  });
  rule({"pipeline_stages", "zero_stage"}, [](const Plan& p) {
    return p.pipeline_stages > 1 && p.zero_stage == 3
               ? "pipeline_stages " + num(p.pipeline_stages) + " requires zero_stage 0, 1 or 2 (got 3)"
               : ok();
  });
  // Offload of model states.
  rule({"offload.params", "zero_stage"}, [](const Plan& p) {
    return p.offload.params && p.zero_stage != 3 ? "offload.params requires zero_stage 3 (got " + num(p.zero_stage) + ")" : ok();
  });
  rule({"offload.optimizer", "zero_stage"}, [](const Plan& p) {
    return p.offload.optimizer && p.zero_stage < 1 ? "offload.optimizer requires zero_stage 1, 2 or 3 (got " + num(p.zero_stage) + ")"
                                                   : ok();
  });
  rule({"offload.grads", "offload.optimizer"}, [](const Plan& p) {
    return p.offload.grads && !p.offload.optimizer
               ? std::string("offload.grads requires offload.optimizer (the host optimizer consumes the gradients)")
               : ok();
  });
  // fairscale OffloadModel (stage 0 also excludes offload.params/grads/optimizer, which need stage >= 1).
  rule({"offload_model.enabled", "offload_model.microbatches", "micro_batch"}, [](const Plan& p) {
    const OffloadModel& om = p.offload_model;
    return om.enabled && om.microbatches >= 1 && p.micro_batch % om.microbatches != 0
               ? "offload_model.microbatches " + num(om.microbatches) + " does not divide micro_batch " + num(p.micro_batch)
               : ok();
  });
  rule({"offload_model.enabled", "zero_stage"}, [](const Plan& p) {
    return p.offload_model.enabled && p.zero_stage != 0 ? "offload_model requires zero_stage 0 (got " + num(p.zero_stage) + ")" : ok();
  });
  rule({"offload_model.enabled", "pipeline_stages"}, [](const Plan& p) {
    return p.offload_model.enabled && p.pipeline_stages != 1
               ? "offload_model requires pipeline_stages 1 (got " + num(p.pipeline_stages) + ")"
               : ok();
  });
  // Checkpointing and its offload; what OffloadModel, which schedules its own activations, excludes.
  rule({"checkpoint_offload", "checkpointing"}, [](const Plan& p) {
    return p.checkpoint_offload && p.checkpointing.mode == Checkpointing::Mode::none
               ? std::string("checkpoint_offload requires checkpointing (got \"none\"): it offloads the checkpointed units' inputs")
               : ok();
  });
  rule({"checkpoint_offload", "offload_model.enabled"}, [](const Plan& p) {
    return p.checkpoint_offload && p.offload_model.enabled
               ? std::string("checkpoint_offload requires offload_model off (OffloadModel keeps its own activations: "
                             "offload_model.checkpoint_activation)")
               : ok();
  });
  rule({"offload_model.enabled", "checkpointing"}, [](const Plan& p) {
    return p.offload_model.enabled && p.checkpointing.mode != Checkpointing::Mode::none
               ? std::string("offload_model requires checkpointing none (OffloadModel checkpoints whole slices: "
                             "offload_model.checkpoint_activation)")
               : ok();
  });
  rule({"offload_model.enabled", "offload.activations_ratio"}, [](const Plan& p) {
    return p.offload_model.enabled && p.offload.activations_ratio > 0
               ? "offload_model requires offload.activations_ratio 0 (got " + num(p.offload.activations_ratio) +
                     "): OffloadModel keeps its own activations"
               : ok();
  });
  rule({"offload_model.enabled", "localsgd_frequency", "adascale"}, [](const Plan& p) {
    return p.offload_model.enabled && (p.localsgd() || p.adascale)
               ? std::string("offload_model requires synchronous data parallelism (got ") +
                     (p.adascale ? std::string("adascale") : localsgd_name(p)) + ")"
               : ok();
  });
  // LocalSGD and SlowMo.
  rule({"localsgd_frequency", "zero_stage"}, [](const Plan& p) {
    return p.localsgd() && p.zero_stage != 0 ? localsgd_name(p) + " requires zero_stage 0 (got " + num(p.zero_stage) + ")" : ok();
  });
  rule({"localsgd_frequency", "pipeline_stages"}, [](const Plan& p) {
    return p.localsgd() && p.pipeline_stages != 1
               ? localsgd_name(p) + " requires pipeline_stages 1 (got " + num(p.pipeline_stages) + ")"
               : ok();
  });
  rule({"localsgd_warmup_steps", "localsgd_frequency"}, [](const Plan& p) {
    return p.localsgd_warmup_steps > 0 && !p.localsgd()
               ? "localsgd_warmup_steps " + num(p.localsgd_warmup_steps) + " requires localsgd_frequency > 1 (got " +
                     num(p.localsgd_frequency) + ")"
               : ok();
  });
  rule({"slowmo_frequency", "slowmo_momentum", "slowmo_lr", "localsgd_frequency"}, [](const Plan& p) {
    const std::string slow_lr = p.slowmo_lr != 1 ? ", slowmo_lr " + num(p.slowmo_lr) : "";
    return (p.slowmo_frequency > 0 || p.slowmo_momentum != 0 || p.slowmo_lr != 1) && !p.localsgd()
               ? "slowmo (slowmo_frequency " + num(p.slowmo_frequency) + ", slowmo_momentum " + num(p.slowmo_momentum) +
                     slow_lr + ") requires localsgd_frequency > 1 (got " + num(p.localsgd_frequency) + ")"
               : ok();
  });
  rule({"slowmo_momentum", "slowmo_lr", "slowmo_frequency"}, [](const Plan& p) {
    const std::string slow_lr = p.slowmo_lr != 1 ? ", slowmo_lr " + num(p.slowmo_lr) : "";
    return (p.slowmo_momentum != 0 || p.slowmo_lr != 1) && p.slowmo_frequency == 0
               ? "slowmo (slowmo_momentum " + num(p.slowmo_momentum) + slow_lr +
                     ") requires slowmo_frequency > 0 (got 0): the slow update never runs"
               : ok();
  });
  // The optimizer and AdaScale.
  rule({"optimizer.max_grad_norm", "localsgd_frequency"}, [](const Plan& p) {
    return p.optimizer.max_grad_norm > 0 && p.localsgd()
               ? "optimizer.max_grad_norm " + num(p.optimizer.max_grad_norm) + " with " + localsgd_name(p) +
                     ": each replica steps on its own gradients, so there is no one norm to clip; clip each replica's "
                     "gradients in your own loop"
               : ok();
  });
  rule({"optimizer.momentum", "optimizer.name"}, [](const Plan& p) {
    return p.optimizer.momentum != 0 && p.optimizer.name != "sgd"
               ? "optimizer.momentum " + num(p.optimizer.momentum) + " is only used by sgd (got " + quote_json(p.optimizer.name) + ")"
               : ok();
  });
  rule({"adascale", "optimizer.name"}, [](const Plan& p) {
    return p.adascale && p.optimizer.name != "sgd" ? "adascale requires optimizer sgd (got " + quote_json(p.optimizer.name) + ")" : ok();
  });
  // Mixed precision.
  rule({"precision.loss_scale", "precision.compute_dtype"}, [](const Plan& p) {
    return p.precision.loss_scale.mode != LossScale::Mode::none && p.precision.compute_dtype == "fp32"
               ? "precision.loss_scale " + write_loss_scale(p.precision.loss_scale).dump() +
                     " requires compute_dtype fp16 or bf16 (got \"fp32\")"
               : ok();
  });
  rule({"precision.broadcast_fp16", "zero_stage"}, [](const Plan& p) {
    return p.precision.broadcast_fp16 && p.zero_stage != 1 && p.zero_stage != 2
               ? "precision.broadcast_fp16 requires zero_stage 1 or 2 (got " + num(p.zero_stage) + ")"
               : ok();
  });
  rule({"precision.fp32_reduce_scatter", "zero_stage"}, [](const Plan& p) {
    return p.precision.fp32_reduce_scatter && p.zero_stage < 2
               ? "precision.fp32_reduce_scatter requires zero_stage 2 or 3 (got " + num(p.zero_stage) + ")"
               : ok();
  });
  rule({"precision.fp32_reduce_scatter", "precision.reduce_dtype"}, [](const Plan& p) {
    return p.precision.fp32_reduce_scatter && p.precision.reduce_dtype != "fp32"
               ? "precision.fp32_reduce_scatter requires reduce_dtype fp32 (got " + quote_json(p.precision.reduce_dtype) + ")"
               : ok();
  });
  return r;
}

}  // namespace

const std::vector<PlanRule>& plan_rules() {
  static const std::vector<PlanRule> rules = build_rules();
  return rules;
}

std::string plan_rule_message(const std::string& reason) { return std::string(kPlanWhere) + ": " + reason; }

void validate(const Plan& p) {
  validate_fields(p);
  for (const PlanRule& r : plan_rules())
    if (std::string why = r.broken(p); !why.empty()) plan_error(why);
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
