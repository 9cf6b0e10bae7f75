// Calibration of the time model on measured runs (calibrate.h): a bounded pattern search over a few
// Calibration terms, each row simulated with them.
#include "zeroplan/sim/calibrate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>
#include <tuple>

#include "zeroplan/sim/errors.h"
#include "zeroplan/sim/fidelity.h"
#include "zeroplan/sim/simulate.h"

namespace zeroplan::sim {
namespace {

// A term: the schema's field (cluster.h calibration_fields), the narrower range the search keeps it in
// (within the valid one), and whether it moves on a log scale.
struct Term {
  const char* name;
  double Calibration::*field;
  double lo, hi;
  bool log;
};

const std::vector<Term>& terms_table() {
  static const std::vector<Term> terms = [] {
    const std::map<std::string, std::tuple<double, double, bool>> search = {
        {"compute_time_scale", {0.1, 10, true}},     {"comm_time_scale", {0.1, 10, true}},
        {"gemm_efficiency_scale", {0.2, 2, true}},   {"gemm_half_dim", {0, 4096, false}},
        {"attention_efficiency_scale", {0.2, 3, true}}, {"memory_bw_scale", {0.1, 2, true}},
        {"kernel_gap_s", {0, 1e-4, false}},          {"compute_with_comm_slowdown", {1, 3, false}}};
    std::vector<Term> v;
    for (const CalibrationField& f : calibration_fields()) {
      const auto& [lo, hi, log] = search.at(f.name);
      v.push_back({f.name, f.field, lo, hi, log});
    }
    return v;
  }();
  return terms;
}

const Term& term(std::string_view name) {
  for (const Term& t : terms_table())
    if (name == t.name) return t;
  throw SimError(fmt::format("calibrate: unknown term \"{}\" (terms: {})", name, fmt::join(calibration_term_names(), ", ")));
}

// Position in [0, 1] of a value within the term's range, and back.
double to_unit(const Term& t, double v) {
  v = std::clamp(v, t.lo, t.hi);
  return t.log ? std::log(v / t.lo) / std::log(t.hi / t.lo) : (v - t.lo) / (t.hi - t.lo);
}
double from_unit(const Term& t, double x) {
  x = std::clamp(x, 0.0, 1.0);
  return t.log ? t.lo * std::pow(t.hi / t.lo, x) : t.lo + x * (t.hi - t.lo);
}

double predict(const CalibrationRow& row, const Calibration& cal) {
  ClusterProfile cluster = row.cluster;
  cluster.calibration = cal;
  return simulate(row.model, cluster, row.plan).step_time_s;
}

// Predicted step times of `rows[i]` for i in `which`, `threads` at a time (each row on one thread; the
// result does not depend on the thread count).
std::vector<double> predict_all(const std::vector<CalibrationRow>& rows, const std::vector<std::size_t>& which,
                                const Calibration& cal, int threads) {
  std::vector<double> out(which.size());
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(which.size())));
  auto work = [&](int t) {
    for (std::size_t i = static_cast<std::size_t>(t); i < which.size(); i += static_cast<std::size_t>(n))
      out[i] = predict(rows[which[i]], cal);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  return out;
}

}  // namespace

const std::vector<std::string>& calibration_term_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Term& t : terms_table()) v.emplace_back(t.name);
    return v;
  }();
  return names;
}

double& calibration_term(Calibration& c, std::string_view name) { return c.*(term(name).field); }
double calibration_term(const Calibration& c, std::string_view name) { return c.*(term(name).field); }

std::vector<std::string> default_terms(const std::vector<CalibrationRow>& rows) {
  const bool ops = !rows.empty() && std::all_of(rows.begin(), rows.end(), [](const CalibrationRow& r) {
    return r.cluster.device.kind == "cuda" && !measured_on_device_kind(r.model, r.cluster);
  });
  if (ops)
    return {"gemm_efficiency_scale", "gemm_half_dim", "attention_efficiency_scale"};
  return {"compute_time_scale", "comm_time_scale"};
}

CalibrationErrors calibration_errors(const std::vector<CalibratedRow>& rows, bool held_out, bool after) {
  CalibrationErrors e;
  std::vector<double> errs;
  for (const CalibratedRow& r : rows) {
    if (r.held_out != held_out) continue;
    const double err = std::abs((after ? r.after_s : r.before_s) - r.measured_s) / r.measured_s;
    errs.push_back(err);
    if (err >= e.worst) {
      e.worst = err;
      e.worst_label = r.label;
    }
  }
  e.rows = static_cast<int>(errs.size());
  if (!errs.empty()) e.median = median(errs);
  return e;
}

CalibrationResult calibrate(const std::vector<CalibrationRow>& rows, const Calibration& given,
                            const CalibrationOptions& options) {
  std::vector<std::size_t> fit, all;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!(rows[i].measured_step_s > 0))
      throw SimError(fmt::format("calibrate: row {} has measured step time {} (must be > 0)", rows[i].label,
                                 rows[i].measured_step_s));
    all.push_back(i);
    if (!rows[i].held_out) fit.push_back(i);
  }
  if (fit.empty()) throw SimError(fmt::format("calibrate: no row to fit ({} rows, all held out)", rows.size()));
  CalibrationResult result;
  result.terms = options.terms.empty() ? default_terms(rows) : options.terms;
  std::vector<const Term*> terms;
  for (const std::string& name : result.terms) terms.push_back(&term(name));
  // The fitted terms start from their neutral values, so a file fitted before is fitted again alike.
  Calibration start = given;
  for (const Term* t : terms) start.*(t->field) = Calibration{}.*(t->field);

  // Mean squared log ratio over the fitted rows.
  auto objective = [&](const Calibration& cal) {
    const std::vector<double> pred = predict_all(rows, fit, cal, options.threads);
    double sum = 0;
    for (std::size_t i = 0; i < fit.size(); ++i) {
      const double r = std::log(pred[i] / rows[fit[i]].measured_step_s);
      sum += r * r;
    }
    ++result.evaluations;
    return sum / static_cast<double>(fit.size());
  };
  auto with = [&](const std::vector<double>& x) {
    Calibration c = start;
    for (std::size_t i = 0; i < terms.size(); ++i) c.*(terms[i]->field) = from_unit(*terms[i], x[i]);
    return c;
  };
  std::vector<double> x;
  for (const Term* t : terms) x.push_back(to_unit(*t, start.*(t->field)));
  double best = objective(with(x));
  // Pattern search: try each coordinate up and down by `step`, keep what improves, halve when nothing does.
  for (double step = 0.25; step > 1.0 / 2048 && result.evaluations < options.max_evaluations;) {
    bool improved = false;
    for (std::size_t i = 0; i < x.size() && result.evaluations < options.max_evaluations; ++i) {
      for (const double dir : {+1.0, -1.0}) {
        std::vector<double> y = x;
        y[i] = std::clamp(x[i] + dir * step, 0.0, 1.0);
        if (y[i] == x[i]) continue;
        const double v = objective(with(y));
        if (v < best - 1e-12) {
          best = v;
          x = std::move(y);
          improved = true;
          break;
        }
      }
    }
    if (!improved) step /= 2;
  }
  // Three significant digits: what the search can tell apart, and what a cluster file shows.
  result.calibration = with(x);
  for (const Term* t : terms) {
    double& v = result.calibration.*(t->field);
    if (v != 0) {
      const double inv = std::pow(10.0, 2 - std::floor(std::log10(std::abs(v))));  // a division by a whole power
      v = std::clamp(std::round(v * inv) / inv, t->lo, t->hi);                        // of 10 gives 0.828, not ...01
    }
  }

  const std::vector<double> before = predict_all(rows, all, start, options.threads);
  const std::vector<double> after = predict_all(rows, all, result.calibration, options.threads);
  for (std::size_t i = 0; i < rows.size(); ++i)
    result.rows.push_back({rows[i].label, rows[i].held_out, rows[i].measured_step_s, before[i], after[i],
                           rows[i].tokens_per_gpu_step});
  result.fitted_before = calibration_errors(result.rows, false, false);
  result.fitted_after = calibration_errors(result.rows, false, true);
  result.held_out_before = calibration_errors(result.rows, true, false);
  result.held_out_after = calibration_errors(result.rows, true, true);
  return result;
}

Throughput throughput(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan, double step_time_s) {
  Throughput t;
  if (!(step_time_s > 0) || plan.world_size < 1) return t;
  const double samples = plan.global_batch, gpus = plan.world_size;
  if (model.seq_len > 0) t.tokens_per_s_per_gpu = samples * static_cast<double>(model.seq_len) / step_time_s / gpus;
  double flops_per_sample = 0;
  for (const UnitProfile& u : model.units)
    flops_per_sample += u.count * (u.flops_fwd.at(1, model.batch) + u.flops_bwd.at(1, model.batch));
  const auto& peaks = cluster.device.peak_flops;
  const auto it = peaks.find(plan.precision.compute_dtype);
  const double peak = it != peaks.end() ? it->second : peaks.count("fp32") ? peaks.at("fp32") : 0.0;
  if (flops_per_sample > 0 && peak > 0) t.mfu = flops_per_sample * samples / (step_time_s * gpus * peak);
  return t;
}

std::string calibration_label(const ClusterProfile& cluster) {
  std::vector<std::string> terms;
  std::string cite;
  for (const std::string& name : calibration_term_names()) {
    const double v = calibration_term(cluster.calibration, name);
    if (v == calibration_term(Calibration{}, name)) continue;
    terms.push_back(fmt::format("{} {:.3g}", name, v));
    if (cite.empty()) {
      const auto it = cluster.provenance.find("calibration." + name);
      if (it != cluster.provenance.end()) cite = it->second.citation;
      else if (cluster.provenance.count("calibration")) cite = cluster.provenance.at("calibration").citation;
    }
  }
  if (terms.empty()) return fmt::format("{} uncalibrated (no calibration terms: zeroplan calibrate fits them)", cluster.name);
  std::string what = cite.substr(0, cite.find(" ("));
  if (const auto c = cite.find("commit "); c != std::string::npos)
    what += ", " + cite.substr(c, cite.find_first_of(";),", c) - c);
  return fmt::format("{} calibrated ({}){}", cluster.name, fmt::join(terms, ", "), what.empty() ? "" : ": " + what);
}

}  // namespace zeroplan::sim
