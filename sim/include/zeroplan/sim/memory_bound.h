// A fast analytic lower bound of a plan's peak memory, for pruning in the tuner: O(units), no task graph.
// It never exceeds what simulate() reports: it counts the model states resident for the whole step plus
// the largest single allocation the step must make while they are resident.
#pragma once

#include <cstdint>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"

namespace zeroplan::sim {

struct MemoryBound {
  std::int64_t device_bytes = 0;        // <= simulated device peak_bytes (allocator overhead excluded)
  std::int64_t host_bytes = 0;          // <= simulated host total_bytes() (pinned blocks rounded on GPUs)
  std::int64_t device_model_state_bytes = 0;  // params + grads + optimizer resident on the device
  std::int64_t host_model_state_bytes = 0;
};

// REQUIRES: validate(plan) and validate(plan, model) pass.
MemoryBound memory_lower_bound(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan);

// A lower bound of simulate(plan).step_time_s from the units' compute times alone, O(units), for the
// tuner's pruning. Pipelined plans: stage b cannot start before the first microbatch's forward crossed
// the stages before it, must run its m forwards and backwards, and the last backward must cross them
// back: max over b of sum_{s<b} (F_s + B_s) + m (F_b + B_b), exact for equal stages and free sends.
// Other plans: 0 (no bound claimed). REQUIRES: as memory_lower_bound.
double step_time_lower_bound(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan);

}  // namespace zeroplan::sim
