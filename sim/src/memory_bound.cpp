#include "zeroplan/sim/memory_bound.h"

#include <algorithm>

#include "lowering/context.h"

namespace zeroplan::sim {

MemoryBound memory_lower_bound(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan) {
  const std::vector<lowering::Unit> units = lowering::expand_units(model, plan, nullptr);
  const lowering::Residency r = lowering::model_state_residency(plan, cluster, units);
  const lowering::Bytes b = lowering::bytes_of(plan);
  MemoryBound out;
  out.device_model_state_bytes = r.dev_params + r.dev_grads + r.dev_optimizer + r.dev_slowmo;
  out.host_model_state_bytes = r.host_params + r.host_grads + r.host_optimizer;
  // Allocations every plan makes: each forward's workspace; at stage 3 (not OffloadModel) each unit's
  // gathered parameters and unsharded gradients.
  std::int64_t largest = 0;
  const bool stage3 = plan.zero_stage == 3 && !plan.offload_model.enabled;
  for (std::size_t i = 0; i < units.size(); ++i) {
    const lowering::Unit& u = units[i];
    // A forward allocates at least its profiled peak (checkpointed) or its workspace and saved bytes.
    largest = std::max(largest, std::min(u.peak_fwd, lowering::forward_workspace(units, i)));
    if (stage3) largest = std::max({largest, u.padded * b.param, u.padded * b.grad});
  }
  out.device_bytes = out.device_model_state_bytes + r.dev_buffers + largest;
  out.host_bytes = out.host_model_state_bytes;
  return out;
}

}  // namespace zeroplan::sim
