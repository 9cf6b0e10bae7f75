#include "zeroplan/profiles/plan.h"

#include <algorithm>

#include "json_util.h"
#include "plan_internal.h"
#include "zeroplan/profiles/knobs.h"
#include "zeroplan/profiles/model_profile.h"

namespace zeroplan {

using detail::kPlanWhere;
using detail::plan_error;
using detail::write_checkpointing;
using detail::write_loss_scale;

namespace {




ojson write_offload(const Offload& o) {
  ojson j;
  j["params"] = o.params;
  j["grads"] = o.grads;
  j["optimizer"] = o.optimizer;
  j["activations_ratio"] = o.activations_ratio;
  j["activations_prefetch_bytes"] = o.activations_prefetch_bytes;
  return j;
}

ojson write_offload_model(const OffloadModel& o) {
  ojson j;
  j["enabled"] = o.enabled;
  j["slices"] = o.slices;
  j["checkpoint_activation"] = o.checkpoint_activation;
  j["microbatches"] = o.microbatches;
  return j;
}

// Pipeline parallelism.
ojson write_balance(const PipelineBalance& b) {
  switch (b.mode) {
    case PipelineBalance::Mode::time: return "time";
    case PipelineBalance::Mode::memory: return "memory";
    case PipelineBalance::Mode::units: return b.units;
  }
  return "time";
}

ojson write_pipeline(const Pipeline& p) {
  ojson j;
  j["balance"] = write_balance(p.balance);
  j["schedule"] = p.schedule;
  j["checkpoint"] = p.checkpoint;
  return j;
}



ojson write_precision(const Precision& p) {
  ojson j;
  j["param_dtype"] = p.param_dtype;
  j["compute_dtype"] = p.compute_dtype;
  j["reduce_dtype"] = p.reduce_dtype;
  j["master_fp32"] = p.master_fp32;
  j["broadcast_fp16"] = p.broadcast_fp16;
  j["fp32_reduce_scatter"] = p.fp32_reduce_scatter;
  j["loss_scale"] = write_loss_scale(p.loss_scale);
  return j;
}

ojson write_buckets(const Buckets& b) {
  ojson j;
  j["all_reduce_bucket_bytes"] = b.all_reduce_bucket_bytes;
  j["reduce_buffer_elems"] = b.reduce_buffer_elems;
  j["allgather_bucket_bytes"] = b.allgather_bucket_bytes;
  j["prefetch"] = b.prefetch;
  j["prefetch_depth"] = b.prefetch_depth;
  return j;
}

ojson write_optimizer(const Optimizer& o) {
  ojson j;
  j["name"] = o.name;
  j["lr"] = o.lr;
  j["momentum"] = o.momentum;
  j["betas"] = o.betas;
  j["eps"] = o.eps;
  j["weight_decay"] = o.weight_decay;
  j["max_grad_norm"] = o.max_grad_norm;
  return j;
}

}  // namespace

ojson detail::write_loss_scale(const LossScale& s) {
  switch (s.mode) {
    case LossScale::Mode::none: return "none";
    case LossScale::Mode::dynamic: return "dynamic";
    case LossScale::Mode::fixed: return s.value;
  }
  return "none";
}

ojson detail::write_checkpointing(const Checkpointing& c) {
  switch (c.mode) {
    case Checkpointing::Mode::none: return "none";
    case Checkpointing::Mode::all: return "all";
    case Checkpointing::Mode::units: return c.units;
  }
  return "none";
}

// Readers of the sub-structures, found by ObjectReader through ADL.
std::string precision_name(const Precision& p) {
  std::string s = p.param_dtype == p.compute_dtype ? p.param_dtype : p.param_dtype + "/" + p.compute_dtype;
  if (p.broadcast_fp16) s += " +bcast16";
  if (p.fp32_reduce_scatter) s += " +fp32-rs";
  if (p.param_dtype != "fp32" && !p.master_fp32) s += " no-master";
  return s;
}

void read_value(const nlohmann::json& j, Offload& o, const std::string& path) {
  ObjectReader r(j, path);
  r.opt("params", o.params);
  r.opt("grads", o.grads);
  r.opt("optimizer", o.optimizer);
  r.opt("activations_ratio", o.activations_ratio);
  r.opt("activations_prefetch_bytes", o.activations_prefetch_bytes);
  r.finish();
}

void read_value(const nlohmann::json& j, OffloadModel& o, const std::string& path) {
  ObjectReader r(j, path);
  r.opt("enabled", o.enabled);
  r.opt("slices", o.slices);
  r.opt("checkpoint_activation", o.checkpoint_activation);
  r.opt("microbatches", o.microbatches);
  r.finish();
}

void read_value(const nlohmann::json& j, PipelineBalance& b, const std::string& path) {
  if (j.is_string() && (j.get<std::string>() == "time" || j.get<std::string>() == "memory")) {
    b = PipelineBalance{j.get<std::string>() == "time" ? PipelineBalance::Mode::time : PipelineBalance::Mode::memory, {}};
    return;
  }
  if (j.is_array()) {
    b.mode = PipelineBalance::Mode::units;
    read_value(j, b.units, path);
    return;
  }
  fail(path, "expected \"time\", \"memory\" or an array of units per stage, got " + describe(j));
}

void read_value(const nlohmann::json& j, Pipeline& p, const std::string& path) {
  ObjectReader r(j, path);
  r.opt("balance", p.balance);
  r.opt("schedule", p.schedule);
  r.opt("checkpoint", p.checkpoint);
  r.finish();
}

void read_value(const nlohmann::json& j, Checkpointing& c, const std::string& path) {
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (s == "none") {
      c = Checkpointing{};
      return;
    }
    if (s == "all") {
      c = Checkpointing{Checkpointing::Mode::all, {}};
      return;
    }
  } else if (j.is_array()) {
    c.mode = Checkpointing::Mode::units;
    read_value(j, c.units, path);
    return;
  }
  fail(path, "expected \"none\", \"all\" or an array of unit indices, got " + describe(j));
}

void read_value(const nlohmann::json& j, LossScale& s, const std::string& path) {
  if (j.is_string()) {
    const std::string v = j.get<std::string>();
    if (v == "none") {
      s = LossScale{};
      return;
    }
    if (v == "dynamic") {
      s = LossScale{LossScale::Mode::dynamic, 0};
      return;
    }
  } else if (j.is_number()) {
    s = LossScale{LossScale::Mode::fixed, j.get<double>()};
    return;
  }
  fail(path, "expected \"none\", \"dynamic\" or a number, got " + describe(j));
}

void read_value(const nlohmann::json& j, Precision& p, const std::string& path) {
  ObjectReader r(j, path);
  r.opt("param_dtype", p.param_dtype);
  r.opt("compute_dtype", p.compute_dtype);
  r.opt("reduce_dtype", p.reduce_dtype);
  r.opt("master_fp32", p.master_fp32);
  r.opt("broadcast_fp16", p.broadcast_fp16);
  r.opt("fp32_reduce_scatter", p.fp32_reduce_scatter);
  r.opt("loss_scale", p.loss_scale);
  r.finish();
}

void read_value(const nlohmann::json& j, Buckets& b, const std::string& path) {
  ObjectReader r(j, path);
  r.opt("all_reduce_bucket_bytes", b.all_reduce_bucket_bytes);
  r.opt("reduce_buffer_elems", b.reduce_buffer_elems);
  r.opt("allgather_bucket_bytes", b.allgather_bucket_bytes);
  r.opt("prefetch", b.prefetch);
  r.opt("prefetch_depth", b.prefetch_depth);
  r.finish();
}

void read_value(const nlohmann::json& j, Optimizer& o, const std::string& path) {
  ObjectReader r(j, path);
  r.opt("name", o.name);
  r.opt("lr", o.lr);
  r.opt("momentum", o.momentum);
  r.opt("betas", o.betas);
  r.opt("eps", o.eps);
  r.opt("weight_decay", o.weight_decay);
  r.opt("max_grad_norm", o.max_grad_norm);
  r.finish();
}

// A Plan nested in another document (Prediction, RunRecord): same rules, its own path.
void read_value(const nlohmann::json& j, Plan& p, const std::string& path) {
  ObjectReader r(j, path);
  check_schema(r, kPlanSchema);
  p = Plan{};
  r.req("world_size", p.world_size);
  r.req("global_batch", p.global_batch);
  r.req("micro_batch", p.micro_batch);
  r.req("microbatches", p.microbatches);
  r.opt("pipeline_stages", p.pipeline_stages);
  r.opt("pipeline", p.pipeline);
  r.req("zero_stage", p.zero_stage);
  r.opt("reshard_after_forward", p.reshard_after_forward);
  r.opt("offload", p.offload);
  r.opt("offload_model", p.offload_model);
  r.opt("checkpointing", p.checkpointing);
  r.opt("checkpoint_offload", p.checkpoint_offload);
  r.opt("localsgd_frequency", p.localsgd_frequency);
  r.opt("localsgd_warmup_steps", p.localsgd_warmup_steps);
  r.opt("slowmo_momentum", p.slowmo_momentum);
  r.opt("slowmo_frequency", p.slowmo_frequency);
  r.opt("slowmo_lr", p.slowmo_lr);
  r.opt("adascale", p.adascale);
  r.opt("precision", p.precision);
  r.opt("buckets", p.buckets);
  r.opt("flat_params", p.flat_params);
  r.opt("optimizer", p.optimizer);
  r.opt("seed", p.seed);
  r.finish();
  fill_dependent_defaults(p, j);  // reshard_after_forward, pipeline.checkpoint: when left out
  validate(p);
}

ojson to_ordered_json(const Plan& p) {
  ojson j;
  j["schema"] = kPlanSchema;
  j["world_size"] = p.world_size;
  j["global_batch"] = p.global_batch;
  j["micro_batch"] = p.micro_batch;
  j["microbatches"] = p.microbatches;
  j["pipeline_stages"] = p.pipeline_stages;
  j["pipeline"] = write_pipeline(p.pipeline);
  j["zero_stage"] = p.zero_stage;
  j["reshard_after_forward"] = p.reshard_after_forward;
  j["offload"] = write_offload(p.offload);
  j["offload_model"] = write_offload_model(p.offload_model);
  j["checkpointing"] = write_checkpointing(p.checkpointing);
  j["checkpoint_offload"] = p.checkpoint_offload;
  j["localsgd_frequency"] = p.localsgd_frequency;
  j["localsgd_warmup_steps"] = p.localsgd_warmup_steps;
  j["slowmo_momentum"] = p.slowmo_momentum;
  j["slowmo_frequency"] = p.slowmo_frequency;
  j["slowmo_lr"] = p.slowmo_lr;
  j["adascale"] = p.adascale;
  j["precision"] = write_precision(p.precision);
  j["buckets"] = write_buckets(p.buckets);
  j["flat_params"] = p.flat_params;
  j["optimizer"] = write_optimizer(p.optimizer);
  j["seed"] = p.seed;
  return j;
}

bool Checkpointing::applies_to(int unit_index) const {
  switch (mode) {
    case Mode::none: return false;
    case Mode::all: return true;
    case Mode::units: return std::binary_search(units.begin(), units.end(), unit_index);
  }
  return false;
}

int Optimizer::states_per_param() const {
  if (name == "adam" || name == "adamw") return 2;
  if (name == "sgd") return momentum != 0 ? 1 : 0;
  return 0;
}

Plan Plan::default_ddp(int world_size, int global_batch) {
  if (world_size < 1) plan_error("world_size must be >= 1 (got " + num(world_size) + ")");
  if (global_batch < 1 || global_batch % world_size != 0)
    plan_error("global_batch " + num(global_batch) + " is not a positive multiple of world_size " +
               num(world_size));
  Plan p;
  p.world_size = world_size;
  p.global_batch = global_batch;
  p.micro_batch = global_batch / world_size;
  p.microbatches = 1;
  return p;
}

void to_json(nlohmann::json& j, const Plan& p) { j = to_plain(to_ordered_json(p)); }

void from_json(const nlohmann::json& j, Plan& p) { read_value(j, p, kPlanWhere); }

}  // namespace zeroplan
