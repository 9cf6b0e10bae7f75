// The knob registry's table: one entry per Plan knob, in Plan order, and the tuner's dimensions.
#include "zeroplan/profiles/knobs.h"

#include <algorithm>
#include <utility>

#include "json_util.h"

namespace zeroplan {
namespace {

// Sets Plan field `field` from JSON with the strict readers of plan.cpp.
#define ZP_ASSIGN(field) \
  [](Plan& p, const nlohmann::json& j, const std::string& path) { read_value(j, p.field, path); }

// A registry entry, built with chained setters.
struct Entry {
  Knob k;
  Entry(std::string name, KnobType type, std::string range, std::string def, std::string description,
        void (*assign)(Plan&, const nlohmann::json&, const std::string&)) {
    k.name = std::move(name);
    k.type = type;
    k.range = std::move(range);
    k.default_text = std::move(def);
    k.description = std::move(description);
    k.assign = assign;
  }
  Entry& tune_knob(std::string dimension) { k.tune_knob = std::move(dimension); return *this; }
  Entry& alias(std::string a) { k.aliases.push_back(std::move(a)); return *this; }
  Entry& choices(std::vector<std::string> c) { k.choices = std::move(c); return *this; }
  // Simulate and tune share support: tune only simulates.
  Entry& simulate(Support s) { k.simulate = k.tune = s; return *this; }
  Entry& run(Support s) { k.run = s; return *this; }
  Entry& depends(std::optional<nlohmann::json> (*f)(const Plan&)) { k.dependent_default = f; return *this; }
  Entry& in_use(bool (*f)(const Plan&)) { k.in_use = f; return *this; }
};

// global_batch / (data-parallel size x other), when it divides evenly.
std::optional<nlohmann::json> batch_split(const Plan& p, int other) {
  const std::int64_t ranks = p.pipeline_stages >= 1 ? p.world_size / p.pipeline_stages : 0;
  const std::int64_t d = ranks * other;
  if (d < 1 || p.global_batch < 1 || p.global_batch % d != 0) return std::nullopt;
  return nlohmann::json(p.global_batch / d);
}

const std::vector<std::string> kDtypes = {"fp32", "fp16", "bf16"};

std::vector<Knob> build() {
  using T = KnobType;
  const Support ignored = Support::ignored;
  const std::vector<Entry> e = {
      Entry("world_size", T::integer, ">= 1", "1", "ranks: data-parallel size x pipeline_stages", ZP_ASSIGN(world_size)),
      Entry("global_batch", T::integer, ">= 1", "1", "samples per optimizer step, over all ranks", ZP_ASSIGN(global_batch)),
      Entry("micro_batch", T::integer, ">= 1", "global_batch / (data-parallel size x microbatches)",
            "samples per rank in one forward and backward", ZP_ASSIGN(micro_batch))
          .tune_knob("micro_batch")
          .depends([](const Plan& p) { return batch_split(p, p.microbatches); }),
      Entry("microbatches", T::integer, ">= 1", "global_batch / (data-parallel size x micro_batch)",
            "gradient accumulation steps (and GPipe microbatches)", ZP_ASSIGN(microbatches))
          .tune_knob("micro_batch")
          .depends([](const Plan& p) { return batch_split(p, p.micro_batch); }),
      // Pipeline parallelism: simulated, tuned and run (the executor needs the balance as units per stage,
      // which `run --profile` and autopilot resolve with pipeline_balance).
      Entry("pipeline_stages", T::integer, ">= 1, divides world_size; > 1 needs zero_stage 0-2", "1",
            "pipeline stages (GPipe / 1F1B); data-parallel size = world_size / pipeline_stages", ZP_ASSIGN(pipeline_stages))
          .tune_knob("pipeline"),
      Entry("pipeline.balance", T::balance, "time | memory | [units per stage, each >= 1, sum = units]", "time",
            "pipeline: units per stage, or balanced by profiled time or by memory (fairscale balance_by_time / _size)",
            ZP_ASSIGN(pipeline.balance))
          .tune_knob("pipeline")
          .in_use([](const Plan& p) { return p.pipeline_stages > 1 && p.pipeline.balance != PipelineBalance{}; }),
      Entry("pipeline.schedule", T::choice, "gpipe | 1f1b", "gpipe",
            "pipeline: gpipe (all forwards, then all backwards) or 1f1b (PipeDream-flush)", ZP_ASSIGN(pipeline.schedule))
          .choices({"gpipe", "1f1b"}).tune_knob("pipeline")
          .in_use([](const Plan& p) { return p.pipeline_stages > 1 && p.pipeline.schedule != "gpipe"; }),
      Entry("pipeline.checkpoint", T::choice, "always | except_last | never; gpipe, checkpointing none",
            "except_last if pipeline_stages > 1, gpipe and checkpointing none; else never",
            "pipeline (fairscale Pipe): recompute each stage's forward in backward for all microbatches, all but the last, "
            "or none", ZP_ASSIGN(pipeline.checkpoint))
          .choices({"always", "except_last", "never"}).tune_knob("pipeline")
          .depends([](const Plan& p) {
            const bool on = p.pipeline_stages > 1 && p.pipeline.schedule == "gpipe" &&
                            p.checkpointing.mode == Checkpointing::Mode::none;
            return std::optional<nlohmann::json>(on ? "except_last" : "never");
          })
          .in_use([](const Plan& p) { return p.pipeline.checkpoint != "never"; }),
      Entry("zero_stage", T::integer, "0..3", "0",
            "ZeRO stage: 0 DDP, 1 OSS (optimizer state), 2 SDP (+ gradients), 3 FSDP (+ parameters)",
            ZP_ASSIGN(zero_stage))
          .tune_knob("zero_stage"),
      Entry("reshard_after_forward", T::boolean, "zero_stage 3 only", "zero_stage == 3",
            "stage 3: free gathered parameters after forward (FSDP FULL_SHARD)", ZP_ASSIGN(reshard_after_forward))
          .tune_knob("reshard_after_forward")
          .depends([](const Plan& p) { return std::optional<nlohmann::json>(p.zero_stage == 3); }),
      Entry("offload.params", T::boolean, "zero_stage 3 only", "false",
            "parameters live on the host, copied in before use (ZeRO-Offload, FSDP CPUOffload)",
            ZP_ASSIGN(offload.params))
          .tune_knob("offload_params").alias("offload_params"),
      Entry("offload.grads", T::boolean, "needs offload.optimizer", "false",
            "gradients copied to the host for the host optimizer", ZP_ASSIGN(offload.grads))
          .tune_knob("offload_grads").alias("offload_grads"),
      Entry("offload.optimizer", T::boolean, "zero_stage >= 1", "false",
            "optimizer state on the host; the step runs there", ZP_ASSIGN(offload.optimizer))
          .tune_knob("offload_optimizer").alias("offload_optimizer"),
      Entry("offload.activations_ratio", T::number, "[0, 1]", "0",
            "share of saved activations sent to the host on a copy stream (hfai CPUOffload)",
            ZP_ASSIGN(offload.activations_ratio))
          .tune_knob("offload_activations").alias("offload_activations"),
      Entry("offload.activations_prefetch_bytes", T::integer, "-1 or >= 0", "-1",
            "offloaded activations on the device beyond the one in use, in bytes: copies out in flight, copies back ahead of need (-1: one tensor back ahead, 0: none)",
            ZP_ASSIGN(offload.activations_prefetch_bytes))
          .in_use([](const Plan& p) { return p.offload.activations_ratio > 0; }),
      Entry("offload_model.enabled", T::boolean, "zero_stage 0, pipeline_stages 1", "false",
            "fairscale OffloadModel: the model lives on the host, copied to the device slice by slice",
            ZP_ASSIGN(offload_model.enabled))
          .tune_knob("offload_model").alias("offload_model"),
      Entry("offload_model.slices", T::integer, "1..units", "1", "OffloadModel: groups of consecutive units",
            ZP_ASSIGN(offload_model.slices))
          .tune_knob("offload_model").alias("offload_model_slices")
          .in_use([](const Plan& p) { return p.offload_model.enabled; }),
      Entry("offload_model.checkpoint_activation", T::boolean, "", "false",
            "OffloadModel: keep only slice-boundary activations, on the host",
            ZP_ASSIGN(offload_model.checkpoint_activation))
          .tune_knob("offload_model").alias("offload_model_checkpoint_activation")
          .in_use([](const Plan& p) { return p.offload_model.enabled; }),
      Entry("offload_model.microbatches", T::integer, ">= 1, divides micro_batch", "1",
            "OffloadModel: microbatches of the micro batch inside each slice", ZP_ASSIGN(offload_model.microbatches))
          .tune_knob("offload_model").alias("offload_model_microbatches")
          .in_use([](const Plan& p) { return p.offload_model.enabled; }),
      Entry("checkpointing", T::checkpointing, "none | all | [unit indices, increasing]", "none",
            "activation checkpointing: keep each unit's input, recompute its forward in backward",
            ZP_ASSIGN(checkpointing))
          .tune_knob("checkpointing"),
      Entry("checkpoint_offload", T::boolean, "needs checkpointing, no offload_model", "false",
            "checkpointed units' kept inputs on the host, back for the recompute (checkpoint_wrapper offload_to_cpu)",
            ZP_ASSIGN(checkpoint_offload))
          .tune_knob("checkpoint_offload").alias("checkpointing.offload"),
      Entry("localsgd_frequency", T::integer, ">= 0; > 1 needs zero_stage 0", "0",
            "LocalSGD: average parameters every N steps instead of gradients every step (0, 1: off)",
            ZP_ASSIGN(localsgd_frequency))
          .tune_knob("localsgd").alias("localsgd")
          .in_use([](const Plan& p) { return p.localsgd(); }),
      Entry("localsgd_warmup_steps", T::integer, ">= 0; > 0 needs localsgd", "0",
            "LocalSGD: fully synchronous steps before the first local one (PostLocalSGDOptimizer warm-up)",
            ZP_ASSIGN(localsgd_warmup_steps)),
      Entry("slowmo_momentum", T::number, "[0, 1); needs localsgd, slowmo_frequency", "0", "SlowMo: slow momentum beta",
            ZP_ASSIGN(slowmo_momentum))
          .tune_knob("localsgd"),
      Entry("slowmo_frequency", T::integer, ">= 0; needs localsgd", "0", "SlowMo: slow update every N steps (0: off)",
            ZP_ASSIGN(slowmo_frequency))
          .tune_knob("localsgd"),
      Entry("slowmo_lr", T::number, "> 0; != 1 needs localsgd, slowmo_frequency", "1",
            "SlowMo: slow learning rate alpha (fairscale slowmo_lr)", ZP_ASSIGN(slowmo_lr)),
      Entry("adascale", T::boolean, "optimizer.name sgd", "false",
            "AdaScale learning-rate gain (one extra small all-reduce)", ZP_ASSIGN(adascale))
          .tune_knob("adascale"),
      Entry("precision.param_dtype", T::choice, "fp32 | fp16 | bf16", "fp32", "dtype of the parameters' compute copy",
            ZP_ASSIGN(precision.param_dtype))
          .choices(kDtypes).tune_knob("precision").alias("param_dtype"),
      Entry("precision.compute_dtype", T::choice, "fp32 | fp16 | bf16", "fp32", "dtype of activations and GEMMs",
            ZP_ASSIGN(precision.compute_dtype))
          .choices(kDtypes).tune_knob("precision").alias("compute_dtype"),
      Entry("precision.reduce_dtype", T::choice, "fp32 | fp16 | bf16", "fp32", "dtype of the gradient collectives",
            ZP_ASSIGN(precision.reduce_dtype))
          .choices(kDtypes).tune_knob("precision").alias("reduce_dtype"),
      Entry("precision.master_fp32", T::boolean, "", "true",
            "keep fp32 master weights for the optimizer (16-bit parameters only)", ZP_ASSIGN(precision.master_fp32))
          .tune_knob("precision").alias("master_fp32"),
      Entry("precision.broadcast_fp16", T::boolean, "zero_stage 1 or 2", "false",
            "fairscale OSS: broadcast the updated shards in fp16", ZP_ASSIGN(precision.broadcast_fp16))
          .tune_knob("broadcast_fp16").alias("broadcast_fp16"),
      Entry("precision.fp32_reduce_scatter", T::boolean, "zero_stage >= 2, reduce_dtype fp32", "false",
            "fairscale FSDP: reduce-scatter gradients in fp32 (16-bit parameters)",
            ZP_ASSIGN(precision.fp32_reduce_scatter))
          .tune_knob("fp32_reduce_scatter").alias("fp32_reduce_scatter"),
      Entry("precision.loss_scale", T::loss_scale, "none | dynamic | > 0; needs 16-bit compute_dtype", "none",
            "loss scaling: none, dynamic, or a fixed scale", ZP_ASSIGN(precision.loss_scale))
          .tune_knob("precision").alias("loss_scale"),
      Entry("buckets.all_reduce_bucket_bytes", T::integer, ">= 1", "26214400",
            "stages 0-1: gradient all-reduce bucket size (DDP bucket_cap_mb 25)",
            ZP_ASSIGN(buckets.all_reduce_bucket_bytes))
          .tune_knob("buckets").alias("all_reduce_bucket_bytes"),
      Entry("buckets.reduce_buffer_elems", T::integer, ">= 1", "8388608",
            "stage 2: reduce-scatter bucket, elements (DeepSpeed reduce_bucket_size, fairscale reduce_buffer_size)",
            ZP_ASSIGN(buckets.reduce_buffer_elems))
          .tune_knob("buckets").alias("reduce_buffer_elems"),
      Entry("buckets.allgather_bucket_bytes", T::integer, ">= 1", "26214400",
            "stages 1-2: all-gather bucket of the updated shards, bytes (DeepSpeed allgather_bucket_size; "
            "consecutive units share one, staged)",
            ZP_ASSIGN(buckets.allgather_bucket_bytes))
          .tune_knob("buckets").alias("allgather_bucket_bytes"),
      Entry("buckets.prefetch", T::boolean, "", "true", "stage 3: gather the next unit's parameters while computing",
            ZP_ASSIGN(buckets.prefetch))
          .tune_knob("prefetch").alias("prefetch"),
      Entry("buckets.prefetch_depth", T::integer, ">= 1", "1",
            "stage 3 with prefetch: units gathered ahead of the one computing, forward and backward (FSDP2: 1; "
            "more hides slower all-gathers for as many gathered units more)",
            ZP_ASSIGN(buckets.prefetch_depth))
          .alias("prefetch_depth"),
      Entry("flat_params", T::boolean, "", "false",
            "optimizer steps on one flat buffer per unit instead of per tensor (run: always flat)",
            ZP_ASSIGN(flat_params))
          .tune_knob("flat_params").run(ignored),
      Entry("optimizer.name", T::choice, "adam | adamw | sgd", "adam", "optimizer", ZP_ASSIGN(optimizer.name))
          .choices({"adam", "adamw", "sgd"}).alias("optimizer"),
      Entry("optimizer.lr", T::number, "> 0", "0.001", "learning rate", ZP_ASSIGN(optimizer.lr))
          .alias("lr").simulate(ignored),
      Entry("optimizer.momentum", T::number, "[0, 1); sgd only", "0", "SGD momentum (one state per parameter when > 0)",
            ZP_ASSIGN(optimizer.momentum))
          .alias("momentum"),
      Entry("optimizer.betas", T::number_pair, "each [0, 1)", "[0.9, 0.999]", "Adam / AdamW betas",
            ZP_ASSIGN(optimizer.betas))
          .simulate(ignored),
      Entry("optimizer.eps", T::number, "> 0", "1e-08", "Adam / AdamW epsilon", ZP_ASSIGN(optimizer.eps))
          .simulate(ignored),
      Entry("optimizer.weight_decay", T::number, ">= 0", "0", "weight decay", ZP_ASSIGN(optimizer.weight_decay))
          .alias("weight_decay").simulate(ignored),
      Entry("optimizer.max_grad_norm", T::number, ">= 0; not with localsgd", "0",
            "clip the gradients' global L2 norm to this before the step (clip_grad_norm_, DeepSpeed gradient_clipping; "
            "0: off)",
            ZP_ASSIGN(optimizer.max_grad_norm))
          .alias("gradient_clipping").simulate(ignored),
      Entry("seed", T::integer, ">= 0", "0", "random seed of the model and data", ZP_ASSIGN(seed)).simulate(ignored),
  };
  std::vector<Knob> out;
  out.reserve(e.size());
  for (const Entry& x : e) out.push_back(x.k);
  return out;
}

#undef ZP_ASSIGN

}  // namespace

std::string Knob::json_pointer() const {
  std::string p = "/" + name;
  std::replace(p.begin(), p.end(), '.', '/');
  return p;
}

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> table = build();
  return table;
}

const std::vector<TuneKnob>& tune_knobs() {
  static const std::vector<TuneKnob> table = {
      {"precision", "fp32, bf16 or fp16 mixed precision (dtypes the device supports)"},
      {"zero_stage", "ZeRO stage 0 (DDP), 1 (OSS), 2 (SDP), 3 (FSDP)"},
      {"reshard_after_forward", "stage 3: free gathered parameters after forward (FULL_SHARD)"},
      {"prefetch", "stage 3: gather the next unit's parameters while computing"},
      {"offload_optimizer", "optimizer state on the host; the step runs there (stage >= 1)"},
      {"offload_grads", "gradients copied to the host for the host optimizer"},
      {"offload_params", "parameters on the host, copied in before use (stage 3)"},
      {"offload_model", "fairscale OffloadModel: slices, checkpoint_activation, microbatches"},
      {"checkpointing", "activation checkpointing: none, all, or the cheapest set of units that fits"},
      {"checkpoint_offload", "checkpointed units' inputs on the host (where checkpointing is on)"},
      {"offload_activations", "share of saved activations sent to the host: the smallest that fits"},
      {"pipeline", "pipeline stages (balanced by time), schedule gpipe or 1f1b, and gpipe's checkpoint mode"},
      {"micro_batch", "micro batch x microbatches (gradient accumulation) dividing the global batch"},
      {"localsgd", "LocalSGD / SlowMo across nodes (needs allow_approximate_averaging)"},
      {"buckets", "bucket sizes: default (25 MiB, 2^23 elements) or large (4x)"},
      {"flat_params", "optimizer steps on one flat buffer per unit"},
      {"broadcast_fp16", "stage 1-2 (OSS): broadcast updated shards in fp16"},
      {"fp32_reduce_scatter", "stage >= 2: reduce-scatter gradients in fp32"},
      {"adascale", "AdaScale learning-rate gain (SGD only)"},
  };
  return table;
}

std::vector<const Knob*> tune_knob_members(std::string_view tune_knob) {
  std::vector<const Knob*> out;
  for (const Knob& k : knobs())
    if (k.tune_knob == tune_knob) out.push_back(&k);
  return out;
}

const Knob* find_knob(std::string_view name) {
  for (const Knob& k : knobs()) {
    if (k.name == name) return &k;
    if (std::find(k.aliases.begin(), k.aliases.end(), name) != k.aliases.end()) return &k;
  }
  return nullptr;
}

std::vector<std::string> knob_names_all() {
  std::vector<std::string> out;
  for (const Knob& k : knobs()) out.push_back(k.name);
  return out;
}

std::vector<std::string> close_knob_names(std::string_view word) {
  std::vector<std::string> spellings;
  for (const Knob& k : knobs()) {
    spellings.push_back(k.name);
    spellings.insert(spellings.end(), k.aliases.begin(), k.aliases.end());
  }
  const Knob* guess = find_knob(closest_match(word, spellings));
  std::vector<std::string> out;
  for (const Knob& k : knobs()) {
    const std::string w(word);
    const auto dot = k.name.rfind('.');
    const bool prefix = k.name.rfind(w + ".", 0) == 0;
    const bool leaf = dot != std::string::npos && k.name.substr(dot + 1) == w;
    if (prefix || leaf || &k == guess) out.push_back(k.name);
  }
  return out;
}

const Knob& knob(std::string_view name, std::string_view where) {
  if (const Knob* k = find_knob(name)) return *k;
  const std::vector<std::string> close = close_knob_names(name);
  std::string list;
  for (const std::string& n : close.empty() ? knob_names_all() : close) list += (list.empty() ? "" : ", ") + n;
  throw SchemaError(std::string(where) + ": unknown knob " + quote_json(name) + "; " +
                    (close.empty() ? "knobs: " : "close: ") + list +
                    (close.empty() ? "" : " (zeroplan plan --fields lists all)"));
}

nlohmann::json knob_value(const Plan& plan, const Knob& knob) {
  const nlohmann::json j = plan;
  return j.at(nlohmann::json::json_pointer(knob.json_pointer()));
}

void apply_dependent_defaults(const Plan& before, Plan& after, const std::set<std::string>& given) {
  std::vector<const Knob*> follow;
  for (const Knob& k : knobs()) {
    if (!k.dependent_default || given.contains(k.name)) continue;
    const auto d = k.dependent_default(before);
    if (d && *d == knob_value(before, k)) follow.push_back(&k);
  }
  for (const Knob* k : follow)
    if (const auto d = k->dependent_default(after)) k->assign(after, *d, k->name);
}

void fill_dependent_defaults(Plan& plan, const nlohmann::json& document) {
  for (const Knob& k : knobs()) {
    if (!k.dependent_default || document.contains(nlohmann::json::json_pointer(k.json_pointer()))) continue;
    if (const auto d = k.dependent_default(plan)) k.assign(plan, *d, k.name);
  }
}

std::vector<std::string> unsupported_knobs(const Plan& plan, Component component) {
  static const Plan defaults;
  std::vector<std::string> out;
  for (const Knob& k : knobs()) {
    const Support s = component == Component::run ? k.run : component == Component::tune ? k.tune : k.simulate;
    if (s != Support::no) continue;
    const nlohmann::json v = knob_value(plan, k);
    if (k.in_use ? !k.in_use(plan) : v == knob_value(defaults, k)) continue;
    out.push_back(k.name + " " + (v.is_string() ? v.get<std::string>() : v.dump()));
  }
  return out;
}

std::string tune_knobs_supported_by(Component component) {
  std::string out;
  for (const TuneKnob& t : tune_knobs()) {
    bool all = true;
    for (const Knob* k : tune_knob_members(t.name)) {
      const Support s = component == Component::run ? k->run : component == Component::tune ? k->tune : k->simulate;
      all = all && s == Support::yes;
    }
    if (all) out += (out.empty() ? "" : ",") + t.name;
  }
  return out;
}

}  // namespace zeroplan
