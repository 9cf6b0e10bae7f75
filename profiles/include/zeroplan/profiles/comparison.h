// Comparison ("zeroplan.comparison/1"): a Prediction next to a RunRecord, metric by metric.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace zeroplan {

struct Metric {
  std::string name;           // "step_time_s", "device_peak_bytes", "phase.backward_s"
  double predicted = 0;
  double measured = 0;
  double rel_error = 0;       // relative_error(predicted, measured), signed
  bool gating = true;         // counts for the verdict; optional, default true
  double tolerance = 0;       // this metric's own tolerance (memory vs time); 0: the document's; optional

  bool operator==(const Metric&) const = default;
};

struct UnitComparison {
  std::string name;
  std::vector<Metric> metrics;  // "fwd_s", "bwd_s"; never gating

  bool operator==(const UnitComparison&) const = default;
};

struct Comparison {
  std::string predicted;     // path of the Prediction
  std::string measured;      // path of the RunRecord
  double tolerance = 0.2;    // largest |rel_error| of a gating metric that passes
  std::string verdict;       // "pass" | "fail"
  std::vector<Metric> metrics;
  std::vector<UnitComparison> units;               // optional
  std::vector<std::string> largest_error_sources;  // human-readable, largest first; optional
  std::vector<std::string> warnings;               // optional

  bool operator==(const Comparison&) const = default;
};

inline constexpr const char* kComparisonSchema = "zeroplan.comparison/1";

// (predicted - measured) / |measured|. When measured is 0: 0 if predicted is 0, else +-1 (100%).
double relative_error(double predicted, double measured);

// "pass" when every gating metric has |rel_error| <= its tolerance (the metric's own when > 0, else
// `tolerance`), else "fail".
std::string verdict_for(const std::vector<Metric>& metrics, double tolerance);

// A metric with rel_error filled in.
Metric make_metric(std::string name, double predicted, double measured, bool gating = true);

// Throws SchemaError: tolerance > 0, metric tolerances >= 0, known verdict equal to
// verdict_for(metrics, tolerance), each rel_error equal to relative_error(predicted, measured)
// (relative 1e-9), unique metric names.
void validate(const Comparison& comparison);

void to_json(nlohmann::json& j, const Comparison& comparison);
void from_json(const nlohmann::json& j, Comparison& comparison);

}  // namespace zeroplan
