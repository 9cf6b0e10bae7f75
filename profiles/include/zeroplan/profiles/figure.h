// A batch-dependent figure (time, bytes, FLOPs) measured at a reference batch and fitted over batches.
#pragma once

#include <array>
#include <cstddef>
#include <vector>

namespace zeroplan {

// Least-squares line of a figure over the micro batch sizes it was profiled at.
struct Fit {
  double intercept = 0;   // value at batch 0 (fixed costs: launch, weight reads)
  double per_sample = 0;  // increase per sample of micro batch
  double r2 = 1;          // coefficient of determination of the fit (1 when exact or not fitted)
  int points = 0;         // batch sizes the fit used; 0 = derived (analytic or constant), not measured

  double at(double batch) const { return intercept + per_sample * batch; }
  bool operator==(const Fit&) const = default;
};

// `value` is what was measured (or derived) at the profile's reference batch, kept for readability and
// for exact use at that batch; `fit` gives the value at any other batch.
// JSON (flat): {"value": v, "intercept": a, "per_sample": b, "r2": r, "points": n, "measured": [[batch,
// value], ...]}; only "value" is required; "measured" is written when there are profiled batches; a missing fit means constant: intercept = value, per_sample = 0, r2 = 1, points = 0.
struct Figure {
  double value = 0;
  Fit fit;
  // What was measured at each profiled batch, in increasing batch order; optional. Memory is not linear
  // in the batch (oneDNN picks another convolution algorithm and its scratchpad at a larger batch): the
  // profiled batches are answered exactly and the ones between them interpolated.
  std::vector<std::array<double, 2>> measured;  // {batch, value}

  // Value at `batch`: exact at the reference batch and at a measured one, interpolated between measured
  // batches, the fitted line outside them.
  double at(double batch, double reference_batch) const {
    if (batch == reference_batch) return value;
    if (measured.size() >= 2 && batch >= measured.front()[0] && batch <= measured.back()[0]) {
      for (std::size_t i = 1; i < measured.size(); ++i) {
        const auto& lo = measured[i - 1];
        const auto& hi = measured[i];
        if (batch > hi[0]) continue;
        if (hi[0] == lo[0]) return hi[1];
        return lo[1] + (hi[1] - lo[1]) * (batch - lo[0]) / (hi[0] - lo[0]);
      }
    }
    return fit.at(batch);
  }
  // A figure that does not depend on batch.
  static Figure constant(double v) { return Figure{v, Fit{v, 0, 1, 0}, {}}; }
  // A figure proportional to batch (activations, FLOPs): v at reference_batch, 0 at batch 0.
  static Figure proportional(double v, double reference_batch) {
    return Figure{v, Fit{0, v / reference_batch, 1, 0}, {}};
  }

  bool operator==(const Figure&) const = default;
};

}  // namespace zeroplan
