// "Why this plan": the knob changes that would turn another plan (the runner-up, the naive default)
// into the winner, one step at a time, each simulated, with what it costs or saves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zeroplan/profiles/plan.h"
#include "zeroplan/profiles/prediction.h"
#include "zeroplan/tuner/evaluator.h"
#include "zeroplan/tuner/search.h"

namespace zeroplan::tuner {

// One step on the path from the other plan to the winner: one knob, or several when changing one alone
// gives an invalid plan (zero_stage 3 -> 0 needs offload_params off in the same step).
struct KnobStep {
  std::vector<std::string> knobs;  // "zero_stage", "offload_activations"
  std::vector<std::string> from;   // values in the other plan, one per knob
  std::vector<std::string> to;     // values in the winner
  bool simulated = false;          // false when the simulator refused the plan after the step
  std::string error;
  double step_time_before_s = 0, step_time_after_s = 0;
  std::int64_t device_before_bytes = 0, device_after_bytes = 0;  // total (with allocator overhead)
  std::int64_t host_before_bytes = 0, host_after_bytes = 0;
  bool fits_after = false;
};

struct PlanComparison {
  std::string against;       // "runner-up" | "default"
  Plan other;
  bool other_simulated = false;
  Prediction other_prediction;
  bool other_fits = false;
  std::vector<KnobStep> steps;  // from `other` to the winner; empty when they are the same plan
  std::vector<std::string> lines;  // the explanation in words, one sentence per line
};

struct Explanation {
  std::vector<PlanComparison> comparisons;
};

// The knobs (names as in constraints.h) in which two plans differ, in canonical order, and a plan's value
// of a knob as text ("3", "true", "0.37", "2 x 4", "units [1]").
std::vector<std::string> differing_knobs(const Plan& a, const Plan& b);
std::string knob_value(const Plan& plan, const std::string& knob);

// Walks from `other` to `winner`, one knob (group) at a time, simulating each plan on the way.
// `other_prediction` is simulated when null. The sentences name the time and memory each step costs or
// saves, and when `other` does not fit, its needed vs available bytes.
PlanComparison compare_plans(const std::string& against, const Plan& winner, const Prediction& winner_prediction,
                             const Plan& other, const Prediction* other_prediction, const Evaluator& evaluator,
                             const MemoryLimits& limits);

}  // namespace zeroplan::tuner
