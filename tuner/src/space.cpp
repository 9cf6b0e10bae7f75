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
  auto no_rule = Rule{};

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
                          no_rule);
  }
  // zero stage
  e.expand<int>([&](const Plan& p) { return c.varies("zero_stage") ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{p.zero_stage}; },
                [](Plan& p, const int& v) { p.zero_stage = v; },
                [](const Plan& p) {
                  return p.zero_stage < 0 || p.zero_stage > 3 ? fmt::format("zero_stage {} is not 0-3", p.zero_stage)
                                                              : std::string();
                });
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("reshard_after_forward"), p.reshard_after_forward); }),
                 Set([](Plan& p, const bool& v) { p.reshard_after_forward = v; }), [](const Plan& p) {
                   return p.reshard_after_forward && p.zero_stage != 3 ? std::string("reshard_after_forward requires zero_stage 3")
                                                                       : std::string();
                 });
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("prefetch"), p.buckets.prefetch); }),
                 Set([](Plan& p, const bool& v) { p.buckets.prefetch = v; }), [&](const Plan& p) {
                   return !p.buckets.prefetch && p.zero_stage != 3 && c.varies("prefetch")
                              ? std::string("prefetch applies only at zero_stage 3")
                              : std::string();
                 });
  // offload of model states
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("offload_optimizer"), p.offload.optimizer); }),
                 Set([](Plan& p, const bool& v) { p.offload.optimizer = v; }), [](const Plan& p) {
                   return p.offload.optimizer && p.zero_stage == 0 ? std::string("offload_optimizer requires zero_stage >= 1")
                                                                   : std::string();
                 });
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("offload_grads"), p.offload.grads); }),
                 Set([](Plan& p, const bool& v) { p.offload.grads = v; }), [](const Plan& p) {
                   return p.offload.grads && !p.offload.optimizer ? std::string("offload_grads requires offload_optimizer")
                                                                  : std::string();
                 });
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("offload_params"), p.offload.params); }),
                 Set([](Plan& p, const bool& v) { p.offload.params = v; }), [](const Plan& p) {
                   return p.offload.params && p.zero_stage != 3 ? std::string("offload_params requires zero_stage 3")
                                                                : std::string();
                 });
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
                   [](const Plan& p) {
                     return p.pipeline_stages > 1 && p.zero_stage == 3 ? std::string("pipeline_stages > 1 requires zero_stage 0-2")
                                                                       : std::string();
                   });
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
      [&](const Plan& p) {
        if (p.micro_batch < 1 || p.microbatches < 1 ||
            static_cast<std::int64_t>(p.micro_batch) * p.microbatches * p.data_parallel_size() != p.global_batch)
          return fmt::format("global_batch {} != micro_batch {} x microbatches {} x data-parallel size {}", p.global_batch,
                             p.micro_batch, p.microbatches, p.data_parallel_size());
        return std::string();
      });
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
                   Set([](Plan& p, const bool& v) { p.offload_model.enabled = v; }), [](const Plan& p) {
                     if (!p.offload_model.enabled) return std::string();
                     if (p.zero_stage != 0) return std::string("offload_model requires zero_stage 0");
                     if (p.pipeline_stages != 1) return std::string("offload_model requires pipeline_stages 1");
                     if (p.offload.params || p.offload.grads || p.offload.optimizer)
                       return std::string("offload_model owns parameter placement: no offload of params, grads or optimizer");
                     return std::string();
                   });
    e.expand<int>(
        [&](const Plan& p) {
          return p.offload_model.enabled && vary_slices ? slices : std::vector<int>{p.offload_model.slices};
        },
        [](Plan& p, const int& v) { p.offload_model.slices = v; },
        [&](const Plan& p) {
          return p.offload_model.enabled && (p.offload_model.slices < 1 || p.offload_model.slices > units)
                     ? fmt::format("offload_model slices {} outside 1..{} units", p.offload_model.slices, units)
                     : std::string();
        });
    e.expand<bool>(Vals([&](const Plan& p) {
                     return p.offload_model.enabled && vary_ckpt ? std::vector<bool>{false, true}
                                                                 : std::vector<bool>{p.offload_model.checkpoint_activation};
                   }),
                   Set([](Plan& p, const bool& v) { p.offload_model.checkpoint_activation = v; }), no_rule);
    e.expand<int>(
        [&](const Plan& p) {
          return p.offload_model.enabled && vary_mbs ? divisors(p.micro_batch) : std::vector<int>{p.offload_model.microbatches};
        },
        [](Plan& p, const int& v) { p.offload_model.microbatches = v; },
        [](const Plan& p) {
          return p.offload_model.enabled && (p.offload_model.microbatches < 1 || p.micro_batch % p.offload_model.microbatches != 0)
                     ? fmt::format("offload_model microbatches {} does not divide micro_batch {}", p.offload_model.microbatches,
                                   p.micro_batch)
                     : std::string();
        });
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
                   Set([](Plan& p, const bool& v) { p.checkpoint_offload = v; }), [&](const Plan& p) {
                     if (!p.checkpoint_offload) return std::string();
                     if (p.offload_model.enabled) return std::string("checkpoint_offload requires offload_model off");
                     return can(p) ? std::string() : std::string("checkpoint_offload requires checkpointing");
                   });
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
                  [](const Plan& p) {
                    if (p.localsgd() && p.zero_stage != 0) return std::string("localsgd requires zero_stage 0 (full replicas)");
                    if (p.localsgd() && p.pipeline_stages != 1) return std::string("localsgd requires pipeline_stages 1");
                    if ((p.slowmo_frequency > 0 || p.slowmo_momentum != 0 || p.slowmo_lr != 1) && !p.localsgd())
                      return std::string("slowmo requires localsgd");
                    if (p.localsgd_warmup_steps > 0 && !p.localsgd())
                      return std::string("localsgd_warmup_steps requires localsgd");
                    if ((p.slowmo_momentum != 0 || p.slowmo_lr != 1) && p.slowmo_frequency == 0)
                      return std::string("slowmo momentum or slowmo_lr requires slowmo_frequency > 0");
                    return std::string();
                  });
  }
  // Buckets (stages 0-2 and OffloadModel's all-reduce).
  {
    const bool vary = c.varies("buckets");
    e.expand<bool>(Vals([&](const Plan&) { return bools(vary, false); }),
                   Set([&](Plan& p, const bool& large) {
                     if (vary && large) apply_fixed(p, "buckets", "large");
                   }),
                   [&](const Plan& p) {
                     return vary && p.zero_stage == 3 && p.buckets.all_reduce_bucket_bytes != Buckets{}.all_reduce_bucket_bytes
                                ? std::string("bucket sizes apply only at zero_stage 0-2")
                                : std::string();
                   });
  }
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("flat_params"), p.flat_params); }),
                 Set([](Plan& p, const bool& v) { p.flat_params = v; }), no_rule);
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("broadcast_fp16"), p.precision.broadcast_fp16); }),
                 Set([](Plan& p, const bool& v) { p.precision.broadcast_fp16 = v; }), [&](const Plan& p) {
                   if (!p.precision.broadcast_fp16) return std::string();
                   if (p.zero_stage != 1 && p.zero_stage != 2) return std::string("broadcast_fp16 requires zero_stage 1 or 2");
                   if (c.varies("broadcast_fp16") && p.precision.param_dtype != "fp32")
                     return std::string("broadcast_fp16 applies only to fp32 parameters");
                   return std::string();
                 });
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("fp32_reduce_scatter"), p.precision.fp32_reduce_scatter); }),
                 Set([&](Plan& p, const bool& v) {
                   p.precision.fp32_reduce_scatter = v;
                   if (v && c.varies("fp32_reduce_scatter")) p.precision.reduce_dtype = "fp32";
                 }),
                 [&](const Plan& p) {
                   if (!p.precision.fp32_reduce_scatter) return std::string();
                   if (p.zero_stage < 2) return std::string("fp32_reduce_scatter requires zero_stage >= 2");
                   if (p.precision.reduce_dtype != "fp32") return std::string("fp32_reduce_scatter requires reduce_dtype fp32");
                   if (c.varies("fp32_reduce_scatter") && p.precision.param_dtype == "fp32")
                     return std::string("fp32_reduce_scatter applies only to 16-bit parameters");
                   return std::string();
                 });
  e.expand<bool>(Vals([&](const Plan& p) { return bools(c.varies("adascale"), p.adascale); }),
                 Set([](Plan& p, const bool& v) { p.adascale = v; }), [](const Plan& p) {
                   return p.adascale && p.optimizer.name != "sgd" ? std::string("adascale requires optimizer sgd") : std::string();
                 });

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
