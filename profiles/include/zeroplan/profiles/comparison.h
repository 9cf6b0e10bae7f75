// Comparison ("zeroplan.comparison/1"): a Prediction next to a RunRecord, metric by metric.
#pragma once

#include <optional>
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

// What a LocalSGD, SlowMo or AdaScale plan's speed costs in loss: its run beside a synchronous (DDP)
// baseline run of the same model, seed and global batch, after the same steps.
struct AveragingPrice {
  std::string baseline;              // path of the baseline RunRecord
  std::string strategy;              // "LocalSGD every 4 steps", "SlowMo every 4 steps (momentum 0.5, slow lr 1)", "AdaScale"
  int steps = 0;                     // steps both runs took (warm-up included: every step trains)
  double loss = 0;                   // mean loss over the last quarter of those steps (at least one)
  double baseline_loss = 0;
  double loss_change = 0;            // (loss - baseline_loss) / |baseline_loss|
  double step_time_s = 0;            // measured medians
  double baseline_step_time_s = 0;
  double speedup = 0;                // baseline_step_time_s / step_time_s

  bool operator==(const AveragingPrice&) const = default;
};

// What the run itself says about how far its step time can be trusted: its own spread and the load
// other programs put on the machine while it ran.
struct NoiseFloor {
  double step_time_p10_s = 0;      // the run's measured steps
  double step_time_p90_s = 0;
  double other_load_cores = 0;     // cores other programs kept busy on average (RunEnvironment)
  int cores = 0;
  double busy_load_cores = 0.25;   // above this the machine was busy: the step time is not judged

  bool operator==(const NoiseFloor&) const = default;
};

struct Comparison {
  std::string predicted;     // path of the Prediction
  std::string measured;      // path of the RunRecord
  double tolerance = 0.2;    // largest |rel_error| of a gating metric that passes
  // "pass" | "fail" | "within noise" | "not judged: machine busy (...)"; see verdict_for
  std::string verdict;
  std::vector<Metric> metrics;
  std::vector<UnitComparison> units;               // optional
  std::vector<std::string> largest_error_sources;  // human-readable, largest first; optional
  std::vector<std::string> warnings;               // optional
  std::optional<AveragingPrice> price;             // optional: with a baseline run (compare --baseline)
  std::optional<NoiseFloor> noise;                 // optional: what the verdict weighed the step time against

  bool operator==(const Comparison&) const = default;
};

inline constexpr const char* kComparisonSchema = "zeroplan.comparison/1";

// (predicted - measured) / |measured|. When measured is 0: 0 if predicted is 0, else +-1 (100%).
double relative_error(double predicted, double measured);

// "pass" when every gating metric has |rel_error| <= its tolerance (the metric's own when > 0, else
// `tolerance`). A memory metric (`*_peak_bytes*`) out of tolerance: "fail" whatever the machine did.
// With `noise`, time metrics out of tolerance are weighed against it: when other programs kept more
// than busy_load_cores busy, "not judged: machine busy (other programs used X of N cores)"; when only
// step_time_s is out and its prediction lies within the run's own p10-p90 band widened by the
// tolerance, "within noise"; else "fail".
std::string verdict_for(const std::vector<Metric>& metrics, double tolerance, const NoiseFloor* noise = nullptr);

// A metric with rel_error filled in.
Metric make_metric(std::string name, double predicted, double measured, bool gating = true);

// Throws SchemaError: tolerance > 0, metric tolerances >= 0, known verdict equal to
// verdict_for(metrics, tolerance), each rel_error equal to relative_error(predicted, measured)
// (relative 1e-9), unique metric names.
void validate(const Comparison& comparison);

void to_json(nlohmann::json& j, const Comparison& comparison);
void from_json(const nlohmann::json& j, Comparison& comparison);

}  // namespace zeroplan
