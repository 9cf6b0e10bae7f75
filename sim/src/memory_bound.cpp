#include "zeroplan/sim/memory_bound.h"

#include <algorithm>

#include "lowering/context.h"
#include "zeroplan/profiles/host_allocator.h"
#include "zeroplan/profiles/pipeline.h"

namespace zeroplan::sim {

namespace {

// One rank's bound over `units` [first, last) of the expanded model.
MemoryBound bound_of(const Plan& plan, const ClusterProfile& cluster, const std::vector<lowering::Unit>& all,
                     std::size_t first, std::size_t last) {
  const std::vector<lowering::Unit> units(all.begin() + static_cast<std::ptrdiff_t>(first),
                                          all.begin() + static_cast<std::ptrdiff_t>(last));
  const lowering::Residency r = lowering::model_state_residency(plan, cluster, units);
  const lowering::Bytes b = lowering::bytes_of(plan);
  MemoryBound out;
  out.device_model_state_bytes = r.dev_params + r.dev_grads + r.dev_optimizer + r.dev_slowmo;
  out.host_model_state_bytes = r.host_params + r.host_grads + r.host_optimizer;
  // Allocations every plan makes: each forward's workspace; at stage 3 (not OffloadModel) each unit's
  // gathered parameters and unsharded gradients.
  std::int64_t largest = 0;
  const bool stage3 = plan.zero_stage == 3 && !plan.offload_model.enabled;
  for (std::size_t i = first; i < last; ++i) {
    const lowering::Unit& u = all[i];
    // A forward allocates at least its profiled peak (checkpointed) or its workspace and saved bytes
    // (a pipeline stage's first unit: its received input is live instead of the previous unit's output).
    largest = std::max(largest, std::min(u.peak_fwd, lowering::forward_workspace(all, i)));
    if (stage3) largest = std::max({largest, u.padded * b.param, u.padded * b.grad});
  }
  out.device_bytes = out.device_model_state_bytes + r.dev_buffers + largest;
  // A gradient shard that exists only from the first reduce-scatter to the optimizer step (stages 2-3) may
  // be absent when the largest forward runs: the bound (never above the true peak) counts it apart.
  if (r.dev_grads_transient) {
    out.device_bytes = std::max(out.device_model_state_bytes - r.dev_grads + r.dev_buffers + largest,
                                out.device_model_state_bytes + r.dev_buffers);
  }
  out.device_bytes += r.dev_model_buffers;  // the units' own buffers, there throughout
  // The resident host blocks (model states and the gradient staging buffer), each rounded up to a
  // power of two where the host memory is pinned (GPU clusters).
  const bool pinned = cluster.device.kind == "cuda";
  for (const std::int64_t block : r.host_blocks()) out.host_bytes += pinned ? pinned_block_bytes(block) : block;
  return out;
}

// What a pipeline stage [first, last) of stage index `stage` holds at least for the microbatches whose
// forward it ran before its first backward (its schedule: profiles' pipeline_order), while it runs the last
// of them: the earlier ones are held. Each holds, until its backward, what its forward kept on the device (the
// lowering's Activations::on_fwd): a unit's saved bytes, or a checkpointed unit's input (none with
// checkpoint_offload), and the stage's last output (the loss's allocation); a pipeline-checkpointed
// microbatch keeps the stage's received input only. With activation offload a unit's offloaded share leaves
// as its forward ends: where the profile lists no saved tensors the unit keeps the rest of what it saves
// (lowering::analytic_offloaded_bytes, its input counted as the stage's lowering counts it; the model's own
// input as none: more offloaded, less kept), so the bound falls as the ratio rises; with a list only what
// units without one save up to their input is counted (a bound must not exceed the peak).
std::int64_t pipeline_in_flight(const Plan& plan, const std::vector<lowering::Unit>& all, std::size_t first,
                                std::size_t last, int stage) {
  std::vector<int> before_backward;  // microbatches forwarded before the stage's first backward
  for (const PipelineOp& op : pipeline_order(plan.pipeline.schedule, plan.pipeline_stages, stage, plan.microbatches)) {
    if (!op.forward) break;
    before_backward.push_back(op.microbatch);
  }
  const double ratio = plan.offload.activations_ratio;
  const bool offload = ratio > 0;
  const bool lists = all[first].tensor_list;  // the stage's lowering picks by tensor when its first unit has a list
  std::int64_t kept = all[last - 1].output;  // one microbatch, not pipeline-checkpointed
  for (std::size_t i = first; i < last; ++i) {
    const lowering::Unit& u = all[i];
    const std::int64_t input = i > 0 ? all[i - 1].output : 0;
    if (u.checkpoint) {
      if (!plan.checkpoint_offload) kept += input;
    } else if (!offload) {
      kept += u.saved;
    } else if (!lists) {
      kept += u.saved - lowering::analytic_offloaded_bytes(u, input, ratio);
    } else if (!u.tensor_list) {
      kept += std::min(u.saved, input);
    }
  }
  const std::int64_t received = first > 0 ? all[first - 1].output : 0;
  std::int64_t held = 0;
  for (std::size_t i = 0; i + 1 < before_backward.size(); ++i)
    held += pipeline_checkpointed(plan, before_backward[i]) ? received : kept;
  return held;
}

}  // namespace

// Pipelined plans: every stage is a rank with its own units; the bound is the largest stage's, with the
// activations of the microbatches in flight on it.
MemoryBound memory_lower_bound(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan) {
  const std::vector<lowering::Unit> units = lowering::expand_units(model, plan, nullptr);
  if (plan.pipeline_stages <= 1) return bound_of(plan, cluster, units, 0, units.size());
  MemoryBound out;
  std::size_t first = 0;
  int stage = 0;
  for (const int n : pipeline_balance(plan, model)) {
    const std::size_t last = first + static_cast<std::size_t>(n);
    const MemoryBound b = bound_of(plan, cluster, units, first, last);
    const std::int64_t held = pipeline_in_flight(plan, units, first, last, stage++);
    first = last;
    out.device_bytes = std::max(out.device_bytes, b.device_bytes + held);
    out.host_bytes = std::max(out.host_bytes, b.host_bytes);
    out.device_model_state_bytes = std::max(out.device_model_state_bytes, b.device_model_state_bytes);
    out.host_model_state_bytes = std::max(out.host_model_state_bytes, b.host_model_state_bytes);
  }
  return out;
}

}  // namespace zeroplan::sim
