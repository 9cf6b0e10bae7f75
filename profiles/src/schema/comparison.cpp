#include "zeroplan/profiles/comparison.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

#include "json_util.h"

namespace zeroplan {

namespace {

constexpr const char* kComparisonWhere = "comparison";

[[noreturn]] void comparison_error(const std::string& message) { fail(kComparisonWhere, message); }

ojson write_metric(const Metric& m) {
  ojson j;
  j["name"] = m.name;
  j["predicted"] = m.predicted;
  j["measured"] = m.measured;
  j["rel_error"] = m.rel_error;
  j["gating"] = m.gating;
  if (m.tolerance > 0) j["tolerance"] = m.tolerance;
  return j;
}

ojson write_unit_comparison(const UnitComparison& u) {
  ojson j;
  j["name"] = u.name;
  j["metrics"] = write_array(u.metrics, write_metric);
  return j;
}

void check_metrics(const std::string& where, const std::vector<Metric>& metrics) {
  std::set<std::string> names;
  for (std::size_t i = 0; i < metrics.size(); ++i) {
    const Metric& m = metrics[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (m.name.empty()) comparison_error(at + ".name is empty");
    if (!(m.tolerance >= 0)) comparison_error(at + " (" + m.name + ").tolerance must be >= 0 (got " + num(m.tolerance) + ")");
    if (!names.insert(m.name).second) comparison_error(at + ".name " + quote_json(m.name) + " is not unique");
    const double expected = relative_error(m.predicted, m.measured);
    if (!(std::fabs(m.rel_error - expected) <= 1e-9 * std::max(1.0, std::fabs(expected))))
      comparison_error(at + " (" + m.name + ").rel_error " + num(m.rel_error) + " != (predicted " + num(m.predicted) +
                       " - measured " + num(m.measured) + ") / measured (= " + num(expected) + ")");
  }
}

ojson write_price(const AveragingPrice& p) {
  ojson j;
  j["baseline"] = p.baseline;
  j["strategy"] = p.strategy;
  j["steps"] = p.steps;
  j["loss"] = p.loss;
  j["baseline_loss"] = p.baseline_loss;
  j["loss_change"] = p.loss_change;
  j["step_time_s"] = p.step_time_s;
  j["baseline_step_time_s"] = p.baseline_step_time_s;
  j["speedup"] = p.speedup;
  return j;
}

void check_price(const AveragingPrice& p) {
  if (p.steps < 1) comparison_error("price.steps must be >= 1 (got " + std::to_string(p.steps) + ")");
  if (!(std::isfinite(p.loss) && std::isfinite(p.baseline_loss)))
    comparison_error("price: losses must be finite (got " + num(p.loss) + " and baseline " + num(p.baseline_loss) + ")");
  if (!(p.step_time_s > 0 && p.baseline_step_time_s > 0))
    comparison_error("price: step times must be > 0 (got " + num(p.step_time_s) + " and baseline " + num(p.baseline_step_time_s) + ")");
  const double change = relative_error(p.loss, p.baseline_loss);
  if (!(std::fabs(p.loss_change - change) <= 1e-9 * std::max(1.0, std::fabs(change))))
    comparison_error("price.loss_change " + num(p.loss_change) + " != (loss - baseline_loss) / |baseline_loss| (= " + num(change) + ")");
  const double speedup = p.baseline_step_time_s / p.step_time_s;
  if (!(std::fabs(p.speedup - speedup) <= 1e-9 * std::max(1.0, speedup)))
    comparison_error("price.speedup " + num(p.speedup) + " != baseline_step_time_s / step_time_s (= " + num(speedup) + ")");
}

}  // namespace

void read_value(const nlohmann::json& j, AveragingPrice& p, const std::string& path) {
  ObjectReader r(j, path);
  r.req("baseline", p.baseline);
  r.req("strategy", p.strategy);
  r.req("steps", p.steps);
  r.req("loss", p.loss);
  r.req("baseline_loss", p.baseline_loss);
  r.req("loss_change", p.loss_change);
  r.req("step_time_s", p.step_time_s);
  r.req("baseline_step_time_s", p.baseline_step_time_s);
  r.req("speedup", p.speedup);
  r.finish();
}

void read_value(const nlohmann::json& j, Metric& m, const std::string& path) {
  ObjectReader r(j, path);
  r.req("name", m.name);
  r.req("predicted", m.predicted);
  r.req("measured", m.measured);
  r.req("rel_error", m.rel_error);
  r.opt("gating", m.gating);
  r.opt("tolerance", m.tolerance);
  r.finish();
}

void read_value(const nlohmann::json& j, UnitComparison& u, const std::string& path) {
  ObjectReader r(j, path);
  r.req("name", u.name);
  r.req("metrics", u.metrics);
  r.finish();
}

double relative_error(double predicted, double measured) {
  if (measured == 0) return predicted == 0 ? 0.0 : std::copysign(1.0, predicted);
  return (predicted - measured) / std::fabs(measured);
}

std::string verdict_for(const std::vector<Metric>& metrics, double tolerance, const NoiseFloor* noise) {
  bool memory_out = false, time_out = false, only_step_within_band = true;
  for (const Metric& m : metrics) {
    const double tol = m.tolerance > 0 ? m.tolerance : tolerance;
    if (!m.gating || std::fabs(m.rel_error) <= tol) continue;
    if (m.name.find("_peak_bytes") != std::string::npos) {
      memory_out = true;
      continue;
    }
    time_out = true;
    const bool in_band = noise != nullptr && m.name == "step_time_s" &&
                         m.predicted >= noise->step_time_p10_s * (1 - tol) && m.predicted <= noise->step_time_p90_s * (1 + tol);
    only_step_within_band = only_step_within_band && in_band;
  }
  if (memory_out) return "fail";
  if (!time_out) return "pass";
  if (noise != nullptr && noise->other_load_cores > noise->busy_load_cores) {
    return fmt::format("not judged: machine busy (other programs used {:.2f} of {} cores)", noise->other_load_cores,
                       noise->cores);
  }
  return noise != nullptr && only_step_within_band ? "within noise" : "fail";
}

Metric make_metric(std::string name, double predicted, double measured, bool gating) {
  return Metric{std::move(name), predicted, measured, relative_error(predicted, measured), gating, 0};
}

ojson to_ordered_json(const Comparison& c) {
  ojson j;
  j["schema"] = kComparisonSchema;
  j["predicted"] = c.predicted;
  j["measured"] = c.measured;
  j["tolerance"] = c.tolerance;
  j["verdict"] = c.verdict;
  j["metrics"] = write_array(c.metrics, write_metric);
  j["units"] = write_array(c.units, write_unit_comparison);
  j["largest_error_sources"] = c.largest_error_sources;
  j["warnings"] = c.warnings;
  if (c.price) j["price"] = write_price(*c.price);
  if (c.noise) {
    ojson n;
    n["step_time_p10_s"] = c.noise->step_time_p10_s;
    n["step_time_p90_s"] = c.noise->step_time_p90_s;
    n["other_load_cores"] = c.noise->other_load_cores;
    n["cores"] = c.noise->cores;
    n["busy_load_cores"] = c.noise->busy_load_cores;
    j["noise"] = n;
  }
  return j;
}

void validate(const Comparison& c) {
  if (!(c.tolerance > 0)) comparison_error("tolerance must be > 0 (got " + num(c.tolerance) + ")");
  check_metrics("metrics", c.metrics);
  for (std::size_t i = 0; i < c.units.size(); ++i) check_metrics("units[" + std::to_string(i) + "].metrics", c.units[i].metrics);
  if (c.noise) {
    const NoiseFloor& n = *c.noise;
    if (!(n.step_time_p10_s >= 0 && n.step_time_p10_s <= n.step_time_p90_s))
      comparison_error("noise: step_time_p10_s " + num(n.step_time_p10_s) + " must be in [0, step_time_p90_s " +
                       num(n.step_time_p90_s) + "]");
    if (!(n.other_load_cores >= 0) || n.cores < 0 || !(n.busy_load_cores >= 0))
      comparison_error("noise: other_load_cores, cores and busy_load_cores must be >= 0 (got " + num(n.other_load_cores) +
                       ", " + num(n.cores) + ", " + num(n.busy_load_cores) + ")");
  }
  const std::string expected = verdict_for(c.metrics, c.tolerance, c.noise ? &*c.noise : nullptr);
  if (c.verdict != expected)
    comparison_error("verdict " + quote_json(c.verdict) + " but the gating metrics at tolerance " + num(c.tolerance) +
                     " give " + quote_json(expected));
  if (c.price) check_price(*c.price);
}

void to_json(nlohmann::json& j, const Comparison& c) { j = to_plain(to_ordered_json(c)); }

void from_json(const nlohmann::json& j, Comparison& c) {
  ObjectReader r(j, kComparisonWhere);
  check_schema(r, kComparisonSchema);
  c = Comparison{};
  r.req("predicted", c.predicted);
  r.req("measured", c.measured);
  r.req("tolerance", c.tolerance);
  r.req("verdict", c.verdict);
  r.req("metrics", c.metrics);
  r.opt("units", c.units);
  r.opt("largest_error_sources", c.largest_error_sources);
  r.opt("warnings", c.warnings);
  if (j.contains("price")) {
    AveragingPrice p;
    r.req("price", p);
    c.price = p;
  }
  if (const nlohmann::json* n = r.take("noise", false)) {
    ObjectReader nr(*n, r.sub("noise"));
    NoiseFloor f;
    nr.req("step_time_p10_s", f.step_time_p10_s);
    nr.req("step_time_p90_s", f.step_time_p90_s);
    nr.req("other_load_cores", f.other_load_cores);
    nr.req("cores", f.cores);
    nr.req("busy_load_cores", f.busy_load_cores);
    nr.finish();
    c.noise = f;
  }
  r.finish();
  validate(c);
}

}  // namespace zeroplan
