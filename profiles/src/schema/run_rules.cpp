// The executor's refusals (knobs.h run_rules): plans that validate accepts, that simulate predicts and
// tune may propose, but that `zeroplan run` and zeroplan.wrap do not run. Registry entries beside the
// knobs: `plan --fields` lists them, the executor checks them (before any rank starts and in every rank),
// autopilot's tuner prunes them.
#include "plan_internal.h"
#include "zeroplan/profiles/knobs.h"

namespace zeroplan {

namespace {

bool half(const std::string& dtype) { return dtype != "fp32"; }

std::vector<RunRule> build_run_rules() {
  std::vector<RunRule> r;
  r.push_back({{"precision.param_dtype", "precision.compute_dtype"},
               "16-bit param_dtype with another compute_dtype (autocast only lowers precision)",
               [](const Plan& p) {
                 const Precision& d = p.precision;
                 return half(d.param_dtype) && d.compute_dtype != d.param_dtype
                            ? "precision.compute_dtype " + d.compute_dtype + " with param_dtype " + d.param_dtype +
                                  ": the executor computes in the parameters' 16-bit dtype or, from fp32 parameters, in any dtype"
                            : std::string();
               }});
  r.push_back({{"precision.param_dtype", "localsgd_frequency"},
               "16-bit param_dtype with LocalSGD / SlowMo (the averaging reads the compute copy, not the master)",
               [](const Plan& p) {
                 return half(p.precision.param_dtype) && p.localsgd()
                            ? "precision.param_dtype " + p.precision.param_dtype + " with localsgd_frequency " +
                                  num(p.localsgd_frequency) + ": the executor runs LocalSGD and SlowMo with fp32 parameters only"
                            : std::string();
               }});
  r.push_back({{"adascale", "precision.loss_scale"},
               "adascale with loss scaling (AdaScale reads the gradients before they are unscaled)",
               [](const Plan& p) {
                 return p.adascale && p.precision.loss_scale.mode != LossScale::Mode::none
                            ? std::string("adascale with precision.loss_scale: the executor runs AdaScale without loss scaling only")
                            : std::string();
               }});
  r.push_back({{"adascale", "localsgd_frequency"},
               "adascale with LocalSGD (the gain needs every step's gradients from every rank)",
               [](const Plan& p) {
                 return p.adascale && p.localsgd() ? "adascale with localsgd_frequency " + num(p.localsgd_frequency) +
                                                         ": AdaScale's gain needs every step's gradients from every rank"
                                                   : std::string();
               }});
  r.push_back({{"adascale", "pipeline_stages"},
               "adascale with pipeline stages (the gain needs the whole gradient on every rank)",
               [](const Plan& p) {
                 return p.adascale && p.pipeline_stages > 1 ? "adascale with pipeline_stages " + num(p.pipeline_stages) +
                                                                  ": AdaScale's gain needs the whole gradient on every rank"
                                                            : std::string();
               }});
  return r;
}

}  // namespace

const std::vector<RunRule>& run_rules() {
  static const std::vector<RunRule> rules = build_run_rules();
  return rules;
}

std::string run_refusal(const Plan& plan) {
  for (const RunRule& r : run_rules())
    if (std::string why = r.broken(plan); !why.empty()) return why;
  return {};
}

}  // namespace zeroplan
