// What the tuner asks of the simulator, behind a small interface so tests can count calls or fake it.
#pragma once

#include <cstdint>
#include <memory>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/profiles/prediction.h"

namespace zeroplan::tuner {

struct MemoryBytes {
  std::int64_t device = 0;
  std::int64_t host = 0;
};

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  // The simulated step of `plan`. Thread-safe. Throws SchemaError / sim::SimError when the plan cannot
  // be simulated (the tuner counts it as rejected with that message).
  virtual Prediction simulate(const Plan& plan) const = 0;
  // Lower bounds of simulate(plan).device.total_bytes() and .host.total_bytes(), cheap (no
  // simulation). Thread-safe. {0, 0} is always correct (no pruning).
  virtual MemoryBytes memory_lower_bound(const Plan& plan) const = 0;
  // A lower bound of simulate(plan).step_time_s, cheap. Thread-safe, never throws: 0 is always correct (no
  // pruning), and is what a plan that cannot be bounded gets (its simulation says why).
  // The search assumes of both bounds, as of simulate(), that raising offload.activations_ratio never
  // raises the device bytes' bound and never lowers the step time's (the simulator's bounds: memory_bound.h).
  virtual double step_time_lower_bound(const Plan& plan) const { (void)plan; return 0; }
};

// The real simulator (zeroplan_sim) and its analytic memory bound on `model` x `cluster`. Both are
// copied, so the evaluator owns what it simulates.
std::unique_ptr<Evaluator> make_simulator(const ModelProfile& model, const ClusterProfile& cluster);

// `inner` (not owned; it must outlive the result) with what `tool` holds beyond zeroplan's executor added
// to every prediction's device peak, as a resident item, and to the device bound
// (tool_device_bytes_beyond_prediction, exports.h): tune --for TOOL fits and ranks the tool's memory.
std::unique_ptr<Evaluator> with_tool_memory(const Evaluator& inner, std::string tool, const ModelProfile& model);

}  // namespace zeroplan::tuner
