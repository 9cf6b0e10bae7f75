// "Why this plan": a telescoping walk from another plan to the winner, knob by knob.
#include "export_common.h"
#include "zeroplan/tuner/explain.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <stdexcept>

#include "text.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/knobs.h"
#include "zeroplan/sim/errors.h"

namespace zeroplan::tuner {
namespace {

struct KnobField {
  const char* name;
  std::function<std::string(const Plan&)> show;
  std::function<void(Plan&, const Plan&)> copy;  // copy the knob's fields from the second plan
};

std::string yes_no(bool b) { return b ? "true" : "false"; }

std::string precision_text(const Precision& p) {
  std::string s;
  if (p.param_dtype == p.compute_dtype && p.compute_dtype == p.reduce_dtype) s = p.param_dtype;
  else s = fmt::format("param {}, compute {}, reduce {}", p.param_dtype, p.compute_dtype, p.reduce_dtype);
  if (p.param_dtype != "fp32" && !p.master_fp32) s += ", no fp32 master";
  if (p.loss_scale.mode == LossScale::Mode::fixed) s += fmt::format(", loss scale {}", p.loss_scale.value);
  else if (p.loss_scale.mode == LossScale::Mode::dynamic && p.param_dtype != "fp16") s += ", dynamic loss scale";
  return s;
}

const std::vector<KnobField>& fields() {
  static const std::vector<KnobField> f = {
      {"precision", [](const Plan& p) { return precision_text(p.precision); },
       [](Plan& p, const Plan& w) {
         const bool b16 = p.precision.broadcast_fp16, rs = p.precision.fp32_reduce_scatter;
         p.precision = w.precision;
         p.precision.broadcast_fp16 = b16;
         p.precision.fp32_reduce_scatter = rs;
       }},
      {"zero_stage", [](const Plan& p) { return std::to_string(p.zero_stage); },
       [](Plan& p, const Plan& w) { p.zero_stage = w.zero_stage; }},
      {"reshard_after_forward", [](const Plan& p) { return yes_no(p.reshard_after_forward); },
       [](Plan& p, const Plan& w) { p.reshard_after_forward = w.reshard_after_forward; }},
      {"prefetch", [](const Plan& p) { return yes_no(p.buckets.prefetch); },
       [](Plan& p, const Plan& w) { p.buckets.prefetch = w.buckets.prefetch; }},
      {"offload_optimizer", [](const Plan& p) { return yes_no(p.offload.optimizer); },
       [](Plan& p, const Plan& w) { p.offload.optimizer = w.offload.optimizer; }},
      {"offload_grads", [](const Plan& p) { return yes_no(p.offload.grads); },
       [](Plan& p, const Plan& w) { p.offload.grads = w.offload.grads; }},
      {"offload_params", [](const Plan& p) { return yes_no(p.offload.params); },
       [](Plan& p, const Plan& w) { p.offload.params = w.offload.params; }},
      {"offload_model",
       [](const Plan& p) {
         const OffloadModel& o = p.offload_model;
         if (!o.enabled) return std::string("off");
         return fmt::format("{} slices{}, {} microbatches", o.slices, o.checkpoint_activation ? ", checkpointed" : "",
                            o.microbatches);
       },
       [](Plan& p, const Plan& w) { p.offload_model = w.offload_model; }},
      {"checkpointing", [](const Plan& p) { return exports::checkpointing_text(p.checkpointing); },
       [](Plan& p, const Plan& w) { p.checkpointing = w.checkpointing; }},
      {"checkpoint_offload", [](const Plan& p) { return yes_no(p.checkpoint_offload); },
       [](Plan& p, const Plan& w) { p.checkpoint_offload = w.checkpoint_offload; }},
      {"offload_activations", [](const Plan& p) { return text::num(p.offload.activations_ratio); },
       [](Plan& p, const Plan& w) { p.offload.activations_ratio = w.offload.activations_ratio; }},
      {"pipeline", [](const Plan& p) { return exports::pipeline_text(p); },
       [](Plan& p, const Plan& w) {
         p.pipeline_stages = w.pipeline_stages;
         p.pipeline = w.pipeline;
       }},
      {"micro_batch", [](const Plan& p) { return fmt::format("{} x {}", p.micro_batch, p.microbatches); },
       [](Plan& p, const Plan& w) {
         p.micro_batch = w.micro_batch;
         p.microbatches = w.microbatches;
       }},
      {"localsgd",
       [](const Plan& p) {
         if (!p.localsgd()) return std::string("off");
         const std::string warm = p.localsgd_warmup_steps > 0 ? fmt::format(" after {} synchronous", p.localsgd_warmup_steps) : "";
         if (p.slowmo())
           return fmt::format("every {}{} (slowmo every {}, momentum {}{})", p.localsgd_frequency, warm, p.slowmo_frequency,
                              p.slowmo_momentum, p.slowmo_lr != 1 ? fmt::format(", lr {}", p.slowmo_lr) : "");
         return fmt::format("every {}{}", p.localsgd_frequency, warm);
       },
       [](Plan& p, const Plan& w) {
         p.localsgd_frequency = w.localsgd_frequency;
         p.localsgd_warmup_steps = w.localsgd_warmup_steps;
         p.slowmo_frequency = w.slowmo_frequency;
         p.slowmo_momentum = w.slowmo_momentum;
         p.slowmo_lr = w.slowmo_lr;
       }},
      {"buckets",
       [](const Plan& p) {
         return fmt::format("{} / {} elems / {}", text::bytes(p.buckets.all_reduce_bucket_bytes), p.buckets.reduce_buffer_elems,
                            text::bytes(p.buckets.allgather_bucket_bytes));
       },
       [](Plan& p, const Plan& w) {
         const Buckets was = p.buckets;  // the sizes only: prefetch is a knob of its own
         p.buckets = w.buckets;
         p.buckets.prefetch = was.prefetch;
         p.buckets.prefetch_depth = was.prefetch_depth;
       }},
      {"flat_params", [](const Plan& p) { return yes_no(p.flat_params); },
       [](Plan& p, const Plan& w) { p.flat_params = w.flat_params; }},
      {"broadcast_fp16", [](const Plan& p) { return yes_no(p.precision.broadcast_fp16); },
       [](Plan& p, const Plan& w) { p.precision.broadcast_fp16 = w.precision.broadcast_fp16; }},
      {"fp32_reduce_scatter", [](const Plan& p) { return yes_no(p.precision.fp32_reduce_scatter); },
       [](Plan& p, const Plan& w) { p.precision.fp32_reduce_scatter = w.precision.fp32_reduce_scatter; }},
      {"adascale", [](const Plan& p) { return yes_no(p.adascale); }, [](Plan& p, const Plan& w) { p.adascale = w.adascale; }},
  };
  // One field per tune knob of the registry, in its canonical order; anything else is a bug here.
  static const bool checked = [] {
    const auto& reg = tune_knobs();
    bool same = reg.size() == f.size();
    for (std::size_t i = 0; same && i < f.size(); ++i) same = reg[i].name == f[i].name;
    if (!same) throw std::logic_error("explain: its knobs differ from the registry's tune knobs");
    return true;
  }();
  (void)checked;
  return f;
}

bool valid(const Plan& p) {
  try {
    validate(p);
    return true;
  } catch (const SchemaError&) {
    return false;
  }
}

std::string change_text(const KnobStep& s) {
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < s.knobs.size(); ++i) parts.push_back(fmt::format("{} {} -> {}", s.knobs[i], s.from[i], s.to[i]));
  return text::join(parts);
}

std::string memory_verdict(const Prediction& p, const MemoryLimits& l) {
  std::vector<std::string> over;
  if (p.device.total_bytes() > l.device_bytes)
    over.push_back(fmt::format("it needs {} of device memory per rank, {} available ({} over)", text::bytes(p.device.total_bytes()),
                               text::bytes(l.device_bytes), text::bytes(p.device.total_bytes() - l.device_bytes)));
  if (p.host.total_bytes() > l.host_bytes)
    over.push_back(fmt::format("it needs {} of host memory, {} available ({} over)", text::bytes(p.host.total_bytes()),
                               text::bytes(l.host_bytes), text::bytes(p.host.total_bytes() - l.host_bytes)));
  return text::join(over, "; ");
}

}  // namespace

std::vector<std::string> differing_knobs(const Plan& a, const Plan& b) {
  std::vector<std::string> out;
  for (const KnobField& f : fields())
    if (f.show(a) != f.show(b)) out.emplace_back(f.name);
  return out;
}

std::string knob_value(const Plan& plan, const std::string& knob) {
  for (const KnobField& f : fields())
    if (knob == f.name) return f.show(plan);
  return {};
}

PlanComparison compare_plans(const std::string& against, const Plan& winner, const Prediction& winner_pred, const Plan& other,
                             const Prediction* other_pred, const Evaluator& ev, const MemoryLimits& limits) {
  PlanComparison c;
  c.against = against;
  c.other = other;
  auto simulate = [&](const Plan& p, std::string& error) -> std::optional<Prediction> {
    try {
      return ev.simulate(p);
    } catch (const SchemaError& e) {
      error = e.what();
      return std::nullopt;
    } catch (const sim::SimError& e) {
      error = e.what();
      return std::nullopt;
    }
  };
  std::string other_error;
  std::optional<Prediction> cur_pred = other_pred ? std::optional<Prediction>(*other_pred) : simulate(other, other_error);
  c.other_simulated = cur_pred.has_value();
  if (cur_pred) {
    c.other_prediction = *cur_pred;
    c.other_fits = fits(*cur_pred, limits);
  }
  const std::string name = against == "default" ? "The default (DDP, no offload, no checkpointing)" : "The runner-up";
  const double wt = winner_pred.step_time_s;
  if (!cur_pred) {
    c.lines.push_back(fmt::format("{} cannot be simulated: {}", name, other_error));
  } else if (c.other_fits) {
    c.lines.push_back(fmt::format("{} fits and takes {} per step ({} vs the winner's {}), peak device memory {} (winner {}).",
                                  name, text::seconds(cur_pred->step_time_s), text::percent(cur_pred->step_time_s / wt - 1),
                                  text::seconds(wt), text::bytes(cur_pred->device.total_bytes()),
                                  text::bytes(winner_pred.device.total_bytes())));
  } else {
    c.lines.push_back(fmt::format("{} does not fit: {}.", name, memory_verdict(*cur_pred, limits)));
  }

  // Walk from `other` to the winner.
  Plan cur = other;
  KnobStep pending;
  for (const KnobField& f : fields()) {
    const std::string from = f.show(cur), to = f.show(winner);
    if (from == to) continue;
    f.copy(cur, winner);
    pending.knobs.emplace_back(f.name);
    pending.from.push_back(from);
    pending.to.push_back(to);
    if (!valid(cur)) continue;  // join the next knob until the plan is valid again
    KnobStep step = std::move(pending);
    pending = KnobStep{};
    if (cur_pred) {
      step.step_time_before_s = cur_pred->step_time_s;
      step.device_before_bytes = cur_pred->device.total_bytes();
      step.host_before_bytes = cur_pred->host.total_bytes();
    }
    const bool last = cur == winner;
    std::optional<Prediction> next = last ? std::optional<Prediction>(winner_pred) : simulate(cur, step.error);
    step.simulated = next.has_value() && cur_pred.has_value();
    if (next) {
      step.step_time_after_s = next->step_time_s;
      step.device_after_bytes = next->device.total_bytes();
      step.host_after_bytes = next->host.total_bytes();
      step.fits_after = fits(*next, limits);
    }
    cur_pred = next;
    c.steps.push_back(std::move(step));
  }
  if (!(cur == winner) && !c.steps.empty()) {
    // Fields outside the knobs (optimizer settings, seed) differ: one last step sets them.
    KnobStep step;
    step.knobs.emplace_back("other settings");
    step.from.emplace_back("other's");
    step.to.emplace_back("winner's");
    c.steps.push_back(step);
  }
  if (c.steps.empty()) {
    c.lines.push_back(fmt::format("{} is the same plan as the winner.", name));
    return c;
  }
  c.lines.push_back(fmt::format("From {} to the winner, knob by knob:", against == "default" ? "the default" : "the runner-up"));
  for (const KnobStep& s : c.steps) {
    if (!s.simulated) {
      c.lines.push_back(fmt::format("- {}: not simulated{}", change_text(s), s.error.empty() ? "" : " (" + s.error + ")"));
      continue;
    }
    const double dt = s.step_time_after_s - s.step_time_before_s;
    const std::int64_t dm = s.device_after_bytes - s.device_before_bytes;
    const std::int64_t dh = s.host_after_bytes - s.host_before_bytes;
    const double rel = s.step_time_before_s > 0 ? s.step_time_after_s / s.step_time_before_s - 1 : 0;
    const std::string time = std::abs(rel) < 5e-4 ? fmt::format("step time unchanged ({})", text::seconds(s.step_time_after_s))
                                                  : fmt::format("step time {}{} ({}, to {})", dt < 0 ? "-" : "+",
                                                                text::seconds(std::abs(dt)), text::percent(rel),
                                                                text::seconds(s.step_time_after_s));
    const std::string mem = dm == 0 ? fmt::format("device peak unchanged ({})", text::bytes(s.device_after_bytes))
                                    : fmt::format("device peak {}{} (to {})", dm < 0 ? "-" : "+", text::bytes(std::abs(dm)),
                                                  text::bytes(s.device_after_bytes));
    std::string line = fmt::format("- {}: {}, {}", change_text(s), time, mem);
    if (dh != 0) line += fmt::format(", host {}{}", dh < 0 ? "-" : "+", text::bytes(dh < 0 ? -dh : dh));
    const bool fit_before = s.device_before_bytes <= limits.device_bytes && s.host_before_bytes <= limits.host_bytes;
    if (!fit_before && s.fits_after) line += "; now fits";
    else if (fit_before && !s.fits_after) line += "; no longer fits";
    else if (!s.fits_after) line += "; still does not fit";
    c.lines.push_back(line);
  }
  return c;
}

}  // namespace zeroplan::tuner
