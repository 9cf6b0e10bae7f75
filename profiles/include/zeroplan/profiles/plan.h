// Plan ("zeroplan.plan/1"): one training configuration, the ZeRO family and relatives.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <functional>
#include <nlohmann/json_fwd.hpp>

namespace zeroplan {

struct ModelProfile;

// CPU offload of model states (ZeRO-Offload, FSDP CPUOffload) and of activations (hfai CPUOffload).
struct Offload {
  bool params = false;            // parameters live on the host, copied in before use
  bool grads = false;             // gradients copied to the host for the host optimizer
  bool optimizer = false;         // optimizer state on the host; the step runs there
  double activations_ratio = 0;   // share of saved activations sent to the host on a side stream, [0, 1]
  // Bytes of offloaded activations copied back ahead of the unit that needs them (activation_offload.h);
  // -1: as many as the most one unit sends (one unit ahead), 0: none (each unit's when its backward starts).
  std::int64_t activations_prefetch_bytes = -1;

  bool operator==(const Offload&) const = default;
};

// fairscale OffloadModel: the model lives on the host, `slices` groups of consecutive units are copied
// to the device one at a time; the micro batch is split in `microbatches` inside each slice.
struct OffloadModel {
  bool enabled = false;
  int slices = 1;
  bool checkpoint_activation = false;  // keep only slice-boundary activations, on the host
  int microbatches = 1;

  bool operator==(const OffloadModel&) const = default;
};

// Activation checkpointing. JSON: "none" | "all" | [unit indices]. Indices are into
// ModelProfile::units; a repeated entry (count > 1) is checkpointed in every repetition.
struct Checkpointing {
  enum class Mode { none, all, units };
  Mode mode = Mode::none;
  std::vector<int> units;  // strictly increasing, only for Mode::units

  bool applies_to(int unit_index) const;
  bool operator==(const Checkpointing&) const = default;
};

// JSON: "none" | "dynamic" | a number (static scale).
struct LossScale {
  enum class Mode { none, dynamic, fixed };
  Mode mode = Mode::none;
  double value = 0;  // only for Mode::fixed, > 0

  bool operator==(const LossScale&) const = default;
};

struct Precision {
  std::string param_dtype = "fp32";    // compute copy of the parameters: "fp32" | "fp16" | "bf16"
  std::string compute_dtype = "fp32";  // activations and GEMMs
  std::string reduce_dtype = "fp32";   // gradient collectives
  bool master_fp32 = true;             // keep fp32 master weights for the optimizer
  bool broadcast_fp16 = false;         // fairscale OSS: broadcast updated shards in fp16
  bool fp32_reduce_scatter = false;    // fairscale FSDP: reduce-scatter gradients in fp32
  LossScale loss_scale;

  bool operator==(const Precision&) const = default;
};

// A precision's name from all its knobs, as tune's table and the reports show it: "fp32", "bf16",
// "bf16/fp32" (parameters / compute), then " +bcast16" (broadcast_fp16), " +fp32-rs"
// (fp32_reduce_scatter), " no-master" (16-bit parameters without an fp32 master).
std::string precision_name(const Precision& p);

struct Buckets {
  std::int64_t all_reduce_bucket_bytes = 25LL << 20;   // DDP bucket_cap_mb default 25 MiB
  std::int64_t reduce_buffer_elems = 1LL << 23;        // fairscale ShardedDDP reduce_buffer_size default
  std::int64_t allgather_bucket_bytes = 25LL << 20;    // ZeRO-1/2 all-gather of updated shards
  bool prefetch = true;                                // ZeRO-3: gather the next unit while computing
  int prefetch_depth = 1;                              // ZeRO-3 with prefetch: units gathered ahead (FSDP2: 1)

  bool operator==(const Buckets&) const = default;
};

struct Optimizer {
  std::string name = "adam";   // "adam" | "adamw" | "sgd"
  double lr = 1e-3;
  double momentum = 0;         // sgd only, [0, 1)
  std::array<double, 2> betas{0.9, 0.999};  // adam/adamw, each [0, 1)
  double eps = 1e-8;
  double weight_decay = 0;
  // Clip the gradients' global L2 norm to this before the step (torch.nn.utils.clip_grad_norm_, DeepSpeed's
  // gradient_clipping); 0: off. JSON: optional (0 when absent).
  double max_grad_norm = 0;

  // Optimizer states per parameter: adam/adamw 2, sgd 1 with momentum, else 0.
  int states_per_param() const;
  bool operator==(const Optimizer&) const = default;
};

// Pipeline parallelism (fairscale Pipe / GPipe, and 1F1B), used when Plan::pipeline_stages > 1.
// JSON: {"balance": "time" | "memory" | [units per stage], "schedule": "gpipe" | "1f1b",
//        "checkpoint": "always" | "except_last" | "never"}.
struct PipelineBalance {
  // time: by profiled forward + backward time (FLOPs where the profile has no times), fairscale
  // balance_by_time; memory: by parameter and saved-activation bytes, fairscale balance_by_size;
  // units: the expanded units per stage, as given.
  enum class Mode { time, memory, units };
  Mode mode = Mode::time;
  std::vector<int> units;  // Mode::units only: one entry per stage, each >= 1

  bool operator==(const PipelineBalance&) const = default;
};

struct Pipeline {
  PipelineBalance balance;
  std::string schedule = "gpipe";   // "gpipe": all forwards, then all backwards; "1f1b": PipeDream-flush
  std::string checkpoint = "never"; // fairscale Pipe (gpipe): "always" | "except_last" | "never"; JSON
                                    // default: except_last with pipeline_stages > 1, gpipe, no checkpointing

  bool operator==(const Pipeline&) const = default;
};

struct Plan {
  int world_size = 1;
  int global_batch = 1;
  int micro_batch = 1;
  int microbatches = 1;         // gradient accumulation steps (and GPipe microbatches)
  int pipeline_stages = 1;      // pipeline stages; data-parallel size = world_size / pipeline_stages; optional
  Pipeline pipeline;            // balance, schedule and checkpoint mode of the stages; optional
  int zero_stage = 0;           // 0 DDP, 1 OSS (optimizer state), 2 SDP (+ grads), 3 FSDP (+ params)
  bool reshard_after_forward = false;  // stage 3 only; JSON default: true at stage 3, false below
  Offload offload;
  OffloadModel offload_model;
  Checkpointing checkpointing;
  bool checkpoint_offload = false;  // checkpointed units' kept inputs on the host (checkpoint_wrapper offload_to_cpu)
  int localsgd_frequency = 0;   // average parameters every N steps instead of gradients every step; 0/1 off
  int localsgd_warmup_steps = 0;  // fully synchronous steps before LocalSGD starts (PostLocalSGDOptimizer)
  double slowmo_momentum = 0;   // SlowMo slow momentum beta, [0, 1)
  int slowmo_frequency = 0;     // SlowMo slow update every N steps; 0 off
  double slowmo_lr = 1.0;       // SlowMo slow learning rate alpha, > 0
  bool adascale = false;        // AdaScale learning-rate gain (one extra small all-reduce)
  Precision precision;
  Buckets buckets;
  bool flat_params = false;     // optimizer steps on one flat buffer per unit instead of per tensor
  Optimizer optimizer;
  std::uint64_t seed = 0;

  int data_parallel_size() const { return world_size / pipeline_stages; }
  bool localsgd() const { return localsgd_frequency > 1; }
  // The optimizer steps on the host: offload.optimizer, or OffloadModel (everything lives there).
  bool optimizer_on_host() const { return offload.optimizer || offload_model.enabled; }
  // Stage 3: the units whose parameters are gathered ahead of the one computing (0 without prefetch).
  int prefetch_ahead() const { return buckets.prefetch ? buckets.prefetch_depth : 0; }
  // A unit's backward adds each parameter's gradient into the flat gradient as autograd makes it: at
  // stages 0-1, where that gradient lives all step (at 2-3 a unit's unsharded gradient is made after its
  // backward), unless AdaScale reads each microbatch's gradient or OffloadModel keeps them on the host.
  bool grads_in_place() const { return zero_stage <= 1 && !adascale && !offload_model.enabled; }
  // Stage 3 on the devices: the optimizer steps each unit whose gradient has landed while the step's last
  // reduce-scatter (the first unit's, often the embedding's) is in flight, then that one's, when nothing in
  // the step needs every gradient first: no clipping, loss scale or AdaScale, no fp32 master beside 16-bit
  // parameters, nothing offloaded, no pipeline. The executor and the simulator both follow it.
  bool steps_beside_last_reduce_scatter() const {
    return zero_stage == 3 && world_size > 1 && pipeline_stages == 1 && !(optimizer.max_grad_norm > 0) &&
           precision.loss_scale.mode == LossScale::Mode::none && !adascale && !offload.optimizer && !offload.params &&
           !offload.grads && !offload_model.enabled && !(precision.param_dtype != "fp32" && precision.master_fp32);
  }
  // fairscale SlowMo is on when its update is not the identity (slowmo_momentum != 0 or slowmo_lr != 1):
  // then it keeps the slow momentum and the previous parameters, and updates every slowmo_frequency steps.
  bool slowmo() const { return localsgd() && slowmo_frequency > 0 && (slowmo_momentum != 0 || slowmo_lr != 1); }

  // Plain data parallel: stage 0, micro_batch = global_batch / world_size, one microbatch, Adam fp32.
  // Throws SchemaError if global_batch is not a positive multiple of world_size.
  static Plan default_ddp(int world_size, int global_batch);

  bool operator==(const Plan&) const = default;
};

inline constexpr const char* kPlanSchema = "zeroplan.plan/1";

// Throws SchemaError naming the field and the numbers. The rules, each with its message shape:
//  - world_size, micro_batch, microbatches, pipeline_stages >= 1; world_size % pipeline_stages == 0
//  - global_batch == micro_batch x microbatches x world_size (x data-parallel size with pipelining):
//    "plan: global_batch 33 != micro_batch 17 x microbatches 2 x world_size 2 (= 68)"
//  - zero_stage in 0..3
//  - pipeline: schedule gpipe | 1f1b; checkpoint always | except_last | never, other than never only
//    with pipeline_stages > 1, schedule gpipe and checkpointing none; a balance list has
//    pipeline_stages entries, each >= 1; pipeline_stages > 1 requires zero_stage 0-2
//  - reshard_after_forward requires zero_stage 3 (FSDP FULL_SHARD; SHARD_GRAD_OP never reshards)
//  - offload.params requires zero_stage 3 (DeepSpeed offload_param, FSDP CPUOffload)
//  - offload.optimizer requires zero_stage >= 1 (DeepSpeed offload_optimizer: stages 1-3)
//  - offload.grads requires offload.optimizer (the host optimizer consumes them)
//  - offload.activations_ratio in [0, 1]
//  - offload_model (when enabled): slices >= 1, microbatches >= 1 dividing micro_batch, zero_stage 0
//    (so no offload.params/grads/optimizer: it owns parameter placement), pipeline_stages 1,
//    checkpointing none, activations_ratio 0, no LocalSGD/SlowMo/AdaScale
//  - checkpointing units: >= 0, strictly increasing, non-empty in "units" mode
//  - checkpoint_offload requires checkpointing (not "none") and no offload_model
//  - localsgd_frequency >= 0; localsgd (> 1) requires zero_stage 0 (every rank keeps full replicas)
//    and pipeline_stages 1; localsgd_warmup_steps >= 0, > 0 requires localsgd
//  - slowmo_frequency >= 0, slowmo_momentum in [0, 1), slowmo_lr > 0; slowmo (frequency > 0,
//    momentum != 0 or slowmo_lr != 1) requires localsgd; momentum != 0 or slowmo_lr != 1 requires
//    slowmo_frequency > 0
//  - adascale requires optimizer sgd (AdaScale is validated for SGD only)
//  - dtypes in {fp32, fp16, bf16}; loss_scale other than "none" requires compute_dtype fp16 or bf16;
//    fixed loss_scale > 0
//  - broadcast_fp16 requires zero_stage 1 or 2 (fairscale OSS)
//  - fp32_reduce_scatter requires zero_stage >= 2 and reduce_dtype fp32
//  - buckets > 0
//  - optimizer: name known, lr > 0, eps > 0, weight_decay >= 0, momentum in [0,1) and 0 unless sgd,
//    betas in [0, 1)
void validate(const Plan& plan);
// validate's checks of single fields (ranges, names), without the rules between knobs: a value given alone
// (tune --fix) is checked by the registry's own words.
void validate_fields(const Plan& plan);

// A rule between knobs, stated once (plan_validate.cpp): validate(plan) checks every one and throws its
// message; the tuner prunes a partial plan with it as soon as the knobs it reads are set, counting the
// same message; `run` refuses with it before any rank starts. `knobs` are the registry names it reads.
struct PlanRule {
  std::vector<std::string> knobs;
  std::function<std::string(const Plan&)> broken;  // the reason the plan breaks it, "" when it holds
};
const std::vector<PlanRule>& plan_rules();
// The message validate throws for a broken rule: "plan: " + the rule's reason.
std::string plan_rule_message(const std::string& reason);

// Checks that need the model: checkpointing unit indices < units.size(), offload_model.slices <=
// expanded unit count, pipeline_stages <= expanded unit count, a pipeline.balance list sums to the
// expanded unit count.
void validate(const Plan& plan, const ModelProfile& model);

void to_json(nlohmann::json& j, const Plan& plan);
void from_json(const nlohmann::json& j, Plan& plan);

}  // namespace zeroplan
