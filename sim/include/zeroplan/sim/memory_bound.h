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
  std::int64_t host_bytes = 0;          // <= simulated host peak_bytes
  std::int64_t device_model_state_bytes = 0;  // params + grads + optimizer resident on the device
  std::int64_t host_model_state_bytes = 0;
};

// REQUIRES: validate(plan) and validate(plan, model) pass.
MemoryBound memory_lower_bound(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan);

}  // namespace zeroplan::sim
