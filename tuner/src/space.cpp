// Enumeration of the discrete knobs, one expansion step per knob. A step turns each partial plan into
// one plan per value of its knob; a value that makes the plan invalid is dropped and counted by reason.
#include "zeroplan/tuner/space.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>

#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/knobs.h"

namespace zeroplan::tuner {
namespace {

// Returns the reason `p` is invalid after the knob just set, or "" when it is fine so far.
using Rule = std::function<std::string(const Plan&)>;

class Expander {
 public:
  Expander(std::vector<Plan> start, std::map<std::string, std::int64_t>& invalid)
      : plans_(std::move(start)), invalid_(invalid) {}

  // For each plan and each value (a setter), keep the result unless `rule` names a reason.
  template <class T>
  void expand(const std::function<std::vector<T>(const Plan&)>& values, const std::function<void(Plan&, const T&)>& set,
              const Rule& rule) {
    std::vector<Plan> next;
    next.reserve(plans_.size() * 2);
    for (const Plan& p : plans_) {
      for (const T& v : values(p)) {
        Plan q = p;
        set(q, v);
        std::string why = rule ? rule(q) : std::string();
        if (why.empty()) next.push_back(std::move(q));
        else ++invalid_[why];
      }
    }
    plans_ = std::move(next);
  }

  std::vector<Plan>& plans() { return plans_; }

 private:
  std::vector<Plan> plans_;
  std::map<std::string, std::int64_t>& invalid_;
};

// The Plan's rules (plan_rules(): validate's own, with its messages) in the search: each is applied at the
// last expansion step that sets a knob it reads, so a partial plan is dropped as soon as it breaks one and
// counted under the message validate throws. Rules that read a knob no step sets are applied at the first
// step; those that read a fitted knob (checkpointing, the activation ratio) are left to each candidate's
// validate at the end.
class Rules {
 public:
  explicit Rules(const std::vector<std::vector<std::string>>& steps) : at_(steps.size()) {
    std::map<std::string, std::size_t> last;
    for (std::size_t i = 0; i < steps.size(); ++i)
      for (const std::string& k : steps[i]) last[k] = i;
    for (const PlanRule& r : plan_rules()) {
      std::size_t step = 0;
      bool fitted = false;
      for (const std::string& k : r.knobs) {
        if (k == "checkpointing" || k == "offload.activations_ratio") fitted = true;
        else if (const auto it = last.find(k); it != last.end()) step = std::max(step, it->second);
      }
      if (!fitted) at_[step].push_back(&r);
    }
  }

  // The rule of step `step`: the plan rules due there, then the step's own search rule (`extra`).
  Rule at(std::size_t step, Rule extra = {}) const {
    return [rules = at_[step], extra = std::move(extra)](const Plan& p) {
      for (const PlanRule* r : rules)
        if (std::string why = r->broken(p); !why.empty()) return plan_rule_message(why);
      return extra ? extra(p) : std::string();
    };
  }

 private:
  std::vector<std::vector<const PlanRule*>> at_;
};

// The expansion steps of enumerate_space, in order, by the registry names of the knobs each sets.
enum Step : std::size_t {
  kPrecision, kZeroStage, kReshard, kPrefetch, kOffloadOptimizer, kOffloadGrads, kOffloadParams, kPipeline, kBatch,
  kOffloadModel, kOffloadModelSlices, kOffloadModelCheckpoint, kOffloadModelMicrobatches, kCheckpointOffload,
  kLocalSgd, kBuckets, kFlatParams, kBroadcastFp16, kFp32ReduceScatter, kAdaScale, kSteps
};
const std::vector<std::vector<std::string>>& step_knobs() {
  static const std::vector<std::vector<std::string>> steps = {
      {"precision.param_dtype", "precision.compute_dtype", "precision.reduce_dtype", "precision.master_fp32",
       "precision.loss_scale"},
      {"zero_stage"},
      {"reshard_after_forward"},
      {"buckets.prefetch"},
      {"offload.optimizer"},
      {"offload.grads"},
      {"offload.params"},
      {"pipeline_stages", "pipeline.schedule", "pipeline.checkpoint", "micro_batch", "microbatches"},
      {"micro_batch", "microbatches"},
      {"offload_model.enabled"},
      {"offload_model.slices"},
      {"offload_model.checkpoint_activation"},
      {"offload_model.microbatches"},
      {"checkpoint_offload"},
      {"localsgd_frequency", "slowmo_frequency", "slowmo_momentum"},
      {"buckets.all_reduce_bucket_bytes", "buckets.reduce_buffer_elems", "buckets.allgather_bucket_bytes"},
      {"flat_params"},
      {"precision.broadcast_fp16"},
      {"precision.fp32_reduce_scatter", "precision.reduce_dtype"},
      {"adascale"},
  };
  return steps;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::vector<bool> bools(bool varies, bool base) { return varies ? std::vector<bool>{false, true} : std::vector<bool>{base}; }

Precision preset(const std::string& name) {
  Precision p;
  if (name == "fp32") return p;
  p.param_dtype = p.compute_dtype = p.reduce_dtype = name;
  p.master_fp32 = true;
  p.loss_scale.mode = name == "fp16" ? LossScale::Mode::dynamic : LossScale::Mode::none;
  return p;
}

struct WorldChoice {
  int world = 1;
  int nodes_used = 1;
};

WorldChoice choose_world(const ClusterProfile& cluster, const TuneConstraints& c, int nodes, std::vector<std::string>& notes) {
  const int dpn = cluster.devices_per_node;
  const int devices = nodes * dpn;
  if (c.world_size > 0) {
    if (c.world_size > devices)
      throw SchemaError(fmt::format("tune: world_size {} > {} nodes x {} devices (= {})", c.world_size, nodes, dpn, devices));
    if (c.global_batch % c.world_size != 0)
      throw SchemaError(fmt::format("tune: global_batch {} is not a multiple of world_size {} (micro batch x microbatches "
                                    "x world size must equal it)",
                                    c.global_batch, c.world_size));
    return {c.world_size, (c.world_size + dpn - 1) / dpn};
  }
  for (int k = nodes; k >= 1; --k) {
    if (c.global_batch % (k * dpn) == 0) {
      if (k != nodes)
        notes.push_back(fmt::format("global batch {} is not a multiple of {} devices ({} nodes x {}): using {} nodes "
                                    "({} ranks), the most whole nodes whose rank count divides it",
                                    c.global_batch, devices, nodes, dpn, k, k * dpn));
      return {k * dpn, k};
    }
  }
  for (int w = std::min(dpn, devices) - 1; w >= 1; --w) {
    if (c.global_batch % w == 0) {
      notes.push_back(fmt::format("global batch {} divides no whole-node rank count: using {} ranks of one node",
                                  c.global_batch, w));
      return {w, 1};
    }
  }
  return {1, 1};
}

}  // namespace

std::int64_t Space::invalid_total() const {
  std::int64_t n = 0;
  for (const auto& [why, count] : invalid) n += count;
  return n;
}

std::vector<std::string> supported_precisions(const ClusterProfile& cluster) {
  std::vector<std::string> out = {"fp32"};
  for (const char* d : {"bf16", "fp16"})
    if (cluster.device.peak_flops.contains(d)) out.emplace_back(d);
  return out;
}

ClusterProfile constrained_cluster(const ClusterProfile& cluster, const TuneConstraints& constraints) {
  ClusterProfile c = cluster;
  if (constraints.nodes > 0) c.nodes = constraints.nodes;
  return c;
}

Space enumerate_space(const ModelProfile& model, const ClusterProfile& cluster_in, const TuneConstraints& c) {
  validate(c);
  const ClusterProfile cluster = constrained_cluster(cluster_in, c);
  Space s;
  s.nodes_available = cluster.nodes;
  const WorldChoice w = choose_world(cluster, c, cluster.nodes, s.notes);
  s.world_size = w.world;
  s.nodes_used = w.nodes_used;
  const int per_rank = c.global_batch / w.world;
  const int units = model.expanded_unit_count();

  Plan base;
  base.world_size = w.world;
  base.global_batch = c.global_batch;
  base.micro_batch = per_rank;
  base.microbatches = 1;
  base.optimizer.name = c.optimizer;
  // The fixed values, then the registry's dependent defaults for the knobs not fixed: the other half of
  // the batch split follows a fixed half, reshard_after_forward follows a fixed zero_stage 3.
  const Plan unfixed = base;
  std::set<std::string> given;
  for (const auto& [key, value] : c.fixed) {
    apply_fixed(base, key, value);
    if (const Knob* k = find_knob(key)) given.insert(k->name);
    else
      for (const Knob* k : tune_knob_members(key)) given.insert(k->name);  // a preset (precision, buckets)
  }
  apply_dependent_defaults(unfixed, base, given);
  s.base = base;

  Expander e({base}, s.invalid);
  using Set = std::function<void(Plan&, const bool&)>;
  using Vals = std::function<std::vector<bool>(const Plan&)>;
  static_assert(kSteps == 20);
  const Rules rules(step_knobs());

  // precision
  {
    std::vector<std::string> names = c.varies("precision") ? supported_precisions(cluster) : std::vector<std::string>{""};
    e.expand<std::string>([&](const Plan&) { return names; },
                          [](Plan& p, const std::string& n) {
                            if (!n.empty()) {
                              const bool b16 = p.precision.broadcast_fp16, f32rs = p.precision.fp32_reduce_scatter;
                              p.precision = preset(n);
                              p.precision.broadcast_fp16 = b16;
                              p.precision.fp32_reduce_scatter = f32rs;
                            }
                          },
                          rules.at(kPrecision));
  }
  // zero stage
  e.expand<int>([&](const Plan& p) { return c.varies("zero_stage") ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{p.zero_stage}; },
                [](Plan& p, const int& v) { p.zero_stage = v; }, rules.at(kZeroStage));
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("reshard_after_forward"), p.reshard_after_forward); }),
                 Set([](Plan& p, const bool& v) { p.reshard_after_forward = v; }), rules.at(kReshard));
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("prefetch"), p.buckets.prefetch); }),
                 Set([](Plan& p, const bool& v) { p.buckets.prefetch = v; }), rules.at(kPrefetch, [&](const Plan& p) {
                   return !p.buckets.prefetch && p.zero_stage != 3 && c.varies("prefetch")
                              ? std::string("search: prefetch applies only at zero_stage 3")
                              : std::string();
                 }));
  // offload of model states
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("offload_optimizer"), p.offload.optimizer); }),
                 Set([](Plan& p, const bool& v) { p.offload.optimizer = v; }), rules.at(kOffloadOptimizer));
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("offload_grads"), p.offload.grads); }),
                 Set([](Plan& p, const bool& v) { p.offload.grads = v; }), rules.at(kOffloadGrads));
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("offload_params"), p.offload.params); }),
                 Set([](Plan& p, const bool& v) { p.offload.params = v; }), rules.at(kOffloadParams));
  // Pipeline: stages (powers of two dividing the world, up to the units), each with the 1f1b schedule and
  // gpipe in fairscale Pipe's three checkpoint modes, the units balanced by time (the balance default).
  // The batch split follows: each pipeline (data-parallel rank) gets global_batch / (world / stages).
  {
    struct Pipe {
      int stages = 1;
      std::string schedule, checkpoint;
    };
    std::vector<Pipe> values = {{base.pipeline_stages, base.pipeline.schedule, base.pipeline.checkpoint}};
    if (c.varies("pipeline")) {
      values = {{1, "gpipe", "never"}};
      for (int k = 2; k <= units && w.world % k == 0; k *= 2)
        for (const char* ck : {"never", "except_last", "always"}) values.push_back({k, "gpipe", ck});
      for (int k = 2; k <= units && w.world % k == 0; k *= 2) values.push_back({k, "1f1b", "never"});
    }
    e.expand<Pipe>([&](const Plan&) { return values; },
                   [&](Plan& p, const Pipe& v) {
                     p.pipeline_stages = v.stages;
                     p.pipeline.schedule = v.schedule;
                     p.pipeline.checkpoint = v.checkpoint;
                     const int batch = c.global_batch / (w.world / v.stages);  // per pipeline
                     if (c.fixes("microbatches")) p.micro_batch = batch / std::max(1, p.microbatches);
                     else p.microbatches = batch / std::max(1, p.micro_batch);
                   },
                   rules.at(kPipeline));
  }
  // micro batch x microbatches; a pipeline of p stages runs at least p microbatches (fewer leave most of
  // every stage idle).
  auto pipeline_batch = [&](const Plan& p) { return c.global_batch / p.data_parallel_size(); };
  e.expand<int>(
      [&](const Plan& p) {
        if (!c.varies("micro_batch")) return std::vector<int>{p.micro_batch};
        std::vector<int> d = divisors(pipeline_batch(p));
        std::erase_if(d, [&](int m) { return pipeline_batch(p) / m < p.pipeline_stages; });
        return d;
      },
      [&](Plan& p, const int& m) {
        p.micro_batch = m;
        if (c.varies("micro_batch")) p.microbatches = pipeline_batch(p) / m;
      },
      rules.at(kBatch, [](const Plan& p) {
        return p.micro_batch < 1 || p.microbatches < 1 ? fmt::format("search: micro_batch {} x microbatches {} below 1",
                                                                     p.micro_batch, p.microbatches)
                                                       : std::string();
      }));
  // OffloadModel: slices, checkpoint_activation, microbatches inside the micro batch
  {
    const bool listed = c.knobs.empty() || c.knobs.contains("offload_model");
    const bool vary_enabled = listed && !c.fixes("offload_model.enabled");
    const bool vary_slices = listed && !c.fixes("offload_model.slices");
    const bool vary_ckpt = listed && !c.fixes("offload_model.checkpoint_activation");
    const bool vary_mbs = listed && !c.fixes("offload_model.microbatches");
    std::vector<int> slices;
    for (int k = 1; k < units; k *= 2) slices.push_back(k);
    slices.push_back(units);
    e.expand<bool>(Vals([&](const Plan& p) { return bools(vary_enabled, p.offload_model.enabled); }),
                   Set([](Plan& p, const bool& v) { p.offload_model.enabled = v; }), rules.at(kOffloadModel));
    e.expand<int>(
        [&](const Plan& p) {
          return p.offload_model.enabled && vary_slices ? slices : std::vector<int>{p.offload_model.slices};
        },
        [](Plan& p, const int& v) { p.offload_model.slices = v; }, rules.at(kOffloadModelSlices));
    e.expand<bool>(Vals([&](const Plan& p) {
                     return p.offload_model.enabled && vary_ckpt ? std::vector<bool>{false, true}
                                                                 : std::vector<bool>{p.offload_model.checkpoint_activation};
                   }),
                   Set([](Plan& p, const bool& v) { p.offload_model.checkpoint_activation = v; }),
                   rules.at(kOffloadModelCheckpoint));
    e.expand<int>(
        [&](const Plan& p) {
          return p.offload_model.enabled && vary_mbs ? divisors(p.micro_batch) : std::vector<int>{p.offload_model.microbatches};
        },
        [](Plan& p, const int& v) { p.offload_model.microbatches = v; }, rules.at(kOffloadModelMicrobatches));
  }
  // Checkpoint offload where a fixed checkpointing is on (a fitted one fits it too: Candidate), never with
  // OffloadModel.
  {
    const bool vary = c.varies("checkpoint_offload") && !c.varies("checkpointing");
    const bool ckpt_fitted = c.varies("checkpointing");
    auto can = [&](const Plan& p) {
      return !p.offload_model.enabled && (ckpt_fitted || p.checkpointing.mode != Checkpointing::Mode::none);
    };
    e.expand<bool>(Vals([&](const Plan& p) { return bools(vary && can(p), p.checkpoint_offload); }),
                   Set([](Plan& p, const bool& v) { p.checkpoint_offload = v; }), rules.at(kCheckpointOffload));
  }
  // LocalSGD / SlowMo: only across nodes and only when approximate averaging is allowed.
  {
    struct Avg {
      int localsgd = 0, slowmo = 0;
      double momentum = 0;
    };
    const bool vary = c.varies("localsgd") && c.allow_approximate_averaging && s.nodes_used > 1;
    if (c.varies("localsgd") && !c.allow_approximate_averaging)
      s.notes.push_back("LocalSGD / SlowMo not searched: they change the optimisation (allow approximate averaging to search them)");
    else if (c.varies("localsgd") && s.nodes_used == 1)
      s.notes.push_back("LocalSGD / SlowMo not searched: they average across nodes and the plan uses one node");
    std::vector<Avg> values = {Avg{}};
    if (vary)
      for (int f : {2, 4, 8}) {
        values.push_back(Avg{f, 0, 0});
        values.push_back(Avg{f, 48, 0.5});
      }
    e.expand<Avg>([&](const Plan& p) {
                    return vary ? values : std::vector<Avg>{Avg{p.localsgd_frequency, p.slowmo_frequency, p.slowmo_momentum}};
                  },
                  [](Plan& p, const Avg& a) {
                    p.localsgd_frequency = a.localsgd;
                    p.slowmo_frequency = a.slowmo;
                    p.slowmo_momentum = a.momentum;
                  },
                  rules.at(kLocalSgd));
  }
  // Buckets (stages 0-2 and OffloadModel's all-reduce).
  {
    const bool vary = c.varies("buckets");
    e.expand<bool>(Vals([&](const Plan&) { return bools(vary, false); }),
                   Set([&](Plan& p, const bool& large) {
                     if (vary && large) apply_fixed(p, "buckets", "large");
                   }),
                   rules.at(kBuckets, [&](const Plan& p) {
                     return vary && p.zero_stage == 3 && p.buckets.all_reduce_bucket_bytes != Buckets{}.all_reduce_bucket_bytes
                                ? std::string("search: bucket sizes apply only at zero_stage 0-2")
                                : std::string();
                   }));
  }
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("flat_params"), p.flat_params); }),
                 Set([](Plan& p, const bool& v) { p.flat_params = v; }), rules.at(kFlatParams));
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("broadcast_fp16"), p.precision.broadcast_fp16); }),
                 Set([](Plan& p, const bool& v) { p.precision.broadcast_fp16 = v; }), rules.at(kBroadcastFp16, [&](const Plan& p) {
                   return p.precision.broadcast_fp16 && c.varies("broadcast_fp16") && p.precision.param_dtype != "fp32"
                              ? std::string("search: broadcast_fp16 applies only to fp32 parameters")
                              : std::string();
                 }));
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("fp32_reduce_scatter"), p.precision.fp32_reduce_scatter); }),
                 Set([&](Plan& p, const bool& v) {
                   p.precision.fp32_reduce_scatter = v;
                   if (v && c.varies("fp32_reduce_scatter")) p.precision.reduce_dtype = "fp32";
                 }),
                 rules.at(kFp32ReduceScatter, [&](const Plan& p) {
                   return p.precision.fp32_reduce_scatter && c.varies("fp32_reduce_scatter") && p.precision.param_dtype == "fp32"
                              ? std::string("search: fp32_reduce_scatter applies only to 16-bit parameters")
                              : std::string();
                 }));
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("adascale"), p.adascale); }),
                 Set([](Plan& p, const bool& v) { p.adascale = v; }), rules.at(kAdaScale));

  // Continuous knobs, and the schema's own rules as the last word.
  const bool fit_act = c.varies("offload_activations");
  const bool fit_ckpt = c.varies("checkpointing");
  s.candidates.reserve(e.plans().size());
  for (Plan& p : e.plans()) {
    Candidate cand;
    // OffloadModel keeps its own activation policy (checkpoint_activation); the others do not apply.
    cand.fit_activations = fit_act && !p.offload_model.enabled;
    // A pipeline that recomputes its stages (fairscale Pipe's checkpoint) checkpoints no single units.
    cand.fit_checkpointing = fit_ckpt && !p.offload_model.enabled && p.pipeline.checkpoint == "never";
    cand.fit_checkpoint_offload = cand.fit_checkpointing && c.varies("checkpoint_offload");
    if (cand.fit_activations) p.offload.activations_ratio = 0;
    if (cand.fit_checkpointing) p.checkpointing = Checkpointing{};
    try {
      // A fitted checkpointing starts at none; a fixed checkpoint_offload is checked against the levels that
      // checkpoint (the search skips none for it).
      Plan checked = p;
      if (cand.fit_checkpointing && p.checkpoint_offload) checked.checkpointing.mode = Checkpointing::Mode::all;
      validate(checked, model);
      validate(checked);
    } catch (const SchemaError& err) {
      ++s.invalid[err.what()];
      continue;
    }
    cand.plan = std::move(p);
    s.candidates.push_back(std::move(cand));
  }
  return s;
}

}  // namespace zeroplan::tuner
