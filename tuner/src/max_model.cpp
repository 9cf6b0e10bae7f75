// The largest GPT of a family that trains under the constraints: a binary search of tunes.
#include "zeroplan/tuner/max_model.h"

#include <fmt/format.h>

#include "export_common.h"
#include "text.h"
#include "zeroplan/profiles/analytic.h"

namespace zeroplan::tuner {
namespace {

ModelProfile profile_of(const GptShape& s, const MaxModelOptions& o) {
  AnalyticGptOptions a;
  a.layers = s.layers;
  a.hidden = s.hidden;
  a.heads = s.heads;
  a.seq = o.seq;
  a.vocab = o.vocab;
  a.dtype = o.dtype;
  a.name = s.name;
  ModelProfile m = analytic_gpt(a);
  // analytic_gpt() gives the embedding neither FLOPs nor time. Its compute time comes from its ops, but a
  // time balance of pipeline stages weighs units without times by their FLOPs (pipeline_balance), where
  // it would be free: count its gather and add (2 x seq x hidden per sample), as the tuner's tests do.
  for (UnitProfile& u : m.units)
    if (u.type == "Embedding" && u.flops_fwd.value <= 0 && u.time_fwd_s.value <= 0)
      u.flops_fwd = u.flops_bwd = Figure::proportional(2.0 * static_cast<double>(o.seq * s.hidden) * m.batch, m.batch);
  return m;
}

}  // namespace

const std::vector<GptShape>& gpt_family() {
  static const std::vector<GptShape> f = {
      {"gpt3-125m", 12, 768, 12},    {"gpt3-350m", 24, 1024, 16},  {"gpt3-760m", 24, 1536, 16},
      {"gpt3-1.3b", 24, 2048, 16},   {"gpt3-2.7b", 32, 2560, 32},  {"gpt3-6.7b", 32, 4096, 32},
      {"gpt3-13b", 40, 5120, 40},    {"gpt-neox-20b", 44, 6144, 64}, {"opt-66b", 64, 9216, 72},
      {"gpt3-175b", 96, 12288, 96},  {"mt-nlg-530b", 105, 20480, 128}, {"megatron-1t", 128, 25600, 160},
  };
  return f;
}

MaxModelResult max_model(const ClusterProfile& cluster, const TuneConstraints& constraints, const MaxModelOptions& options) {
  const std::vector<GptShape>& family = options.family.empty() ? gpt_family() : options.family;
  MaxModelResult r;
  TuneOptions quick = options.tune;
  quick.explain = false;
  auto attempt = [&](int i) {
    const GptShape& s = family[static_cast<std::size_t>(i)];
    const ModelProfile m = profile_of(s, options);
    TuneResult t = tune(m, cluster, constraints, quick);
    MaxModelTry x;
    x.shape = s;
    x.params = m.total_params();
    x.fits = t.best() != nullptr;
    if (x.fits) x.best = *t.best();
    else if (!t.rejections.closest.empty()) {
      const Rejection& c = t.rejections.closest.front();
      x.why_not = fmt::format("closest plan is {} over on the device{} ({})", text::bytes(c.device_excess_bytes),
                              c.host_excess_bytes > 0 ? fmt::format(" and {} over on the host", text::bytes(c.host_excess_bytes)) : "",
                              exports::plan_summary(c.plan));
    } else if (!t.rejections.error_messages.empty()) {
      x.why_not = t.rejections.error_messages.begin()->first;
    } else {
      x.why_not = "no candidate";
    }
    r.tried.push_back(std::move(x));
    return r.tried.back().fits;
  };
  // Invariant: family[lo] fits (or lo = -1), family[hi] does not (or hi = size).
  int lo = -1, hi = static_cast<int>(family.size());
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (attempt(mid)) lo = mid;
    else hi = mid;
  }
  r.largest = lo;
  if (lo >= 0) {
    TuneOptions full = options.tune;
    r.largest_tune = tune(profile_of(family[static_cast<std::size_t>(lo)], options), cluster, constraints, full);
  }
  return r;
}

std::string max_model_markdown(const MaxModelResult& r, const MaxModelOptions& options) {
  const std::vector<GptShape>& family = options.family.empty() ? gpt_family() : options.family;
  std::string s = "# Largest GPT that trains\n\n";
  if (r.largest >= 0 && r.largest_tune && r.largest_tune->best()) {
    const GptShape& g = family[static_cast<std::size_t>(r.largest)];
    const RankedPlan& b = *r.largest_tune->best();
    s += fmt::format("**{}** ({:.2f} B parameters: {} layers, hidden {}, {} heads, sequence {}) trains at {} per step, {:.2f} "
                     "samples/s, with: {}.\n\n",
                     g.name, static_cast<double>(r.largest_tune->model.total_params()) / 1e9, g.layers, g.hidden, g.heads,
                     options.seq, text::seconds(b.prediction.step_time_s), b.prediction.samples_per_s, exports::plan_summary(b.plan));
  } else {
    s += "No model of the family trains under these constraints.\n\n";
  }
  s += "| model | parameters | fits | step time | plan or why not |\n|---|---|---|---|---|\n";
  for (const MaxModelTry& t : r.tried)
    s += fmt::format("| {} | {:.2f} B | {} | {} | {} |\n", t.shape.name, static_cast<double>(t.params) / 1e9, t.fits ? "yes" : "no",
                     t.best ? text::seconds(t.best->prediction.step_time_s) : "", t.best ? exports::plan_summary(t.best->plan) : t.why_not);
  return s;
}

}  // namespace zeroplan::tuner
