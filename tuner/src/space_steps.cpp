// The expansion steps of the search space (space.cpp runs them in order): one step per knob or group,
// each dropping the partial plans that break a rule due at it (Rules) and counting them by its message.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>
#include <stdexcept>

#include "space_internal.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/knobs.h"

namespace zeroplan::tuner::space_detail {

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


const std::vector<std::string>& fitted_knobs() {
  static const std::vector<std::string> fitted = {"checkpointing", "offload.activations_ratio"};
  return fitted;
}

void check_step_knobs(std::size_t step, const Plan& before, const Plan& after) {
  const std::vector<std::string>& listed = step_knobs().at(step);
  Plan restored = after;  // the listed knobs put back: nothing else may differ
  for (const std::string& name : listed) {
    const Knob& k = knob(name);
    k.assign(restored, knob_value(before, k), k.name);
  }
  if (restored == before) return;
  for (const Knob& k : knobs()) {
    if (std::find(listed.begin(), listed.end(), k.name) != listed.end()) continue;
    if (knob_value(before, k) != knob_value(after, k))
      throw std::logic_error(fmt::format("tuner expansion step {} sets {} ({} -> {}), which step_knobs() does not list for it",
                                         step, k.name, knob_value(before, k).dump(), knob_value(after, k).dump()));
  }
  throw std::logic_error(fmt::format("tuner expansion step {} changes the plan outside the knobs it lists", step));
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::vector<bool> bools(bool varies, bool base) { return varies ? std::vector<bool>{false, true} : std::vector<bool>{base}; }

namespace {

Precision preset(const std::string& name) {
  Precision p;
  if (name == "fp32") return p;
  p.param_dtype = p.compute_dtype = p.reduce_dtype = name;
  p.master_fp32 = true;
  p.loss_scale.mode = name == "fp16" ? LossScale::Mode::dynamic : LossScale::Mode::none;
  return p;
}

}  // namespace

// Precision, ZeRO stage, resharding, prefetch and the offload of model states.
void Enumeration::expand_sharding() {
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
}

// Pipeline stages, schedule and checkpoint mode, then the batch split.
void Enumeration::expand_pipeline() {
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
}

// fairscale OffloadModel.
void Enumeration::expand_offload_model() {
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
}

// Checkpoint offload, LocalSGD / SlowMo, buckets, flat parameters, the reduce dtypes and AdaScale.
void Enumeration::expand_rest() {
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

}

// The expanded plans as candidates, with what each fits (fitted_knobs(): checkpointing, the activation ratio) and the
// schema's own rules as the last word.
void Enumeration::make_candidates(const ModelProfile& model) {
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
}


}  // namespace zeroplan::tuner::space_detail
