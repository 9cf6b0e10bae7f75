// Where the model states live for the whole step, per zero stage and offload (the ZeRO paper's
// accounting): params in param dtype, grads in param dtype, optimizer = fp32 master (16-bit params with
// master_fp32) + fp32 states. Shards are padded: ceil(P/N) per unit at stage 3 (one flat parameter per
// unit), ceil(P/N) of the whole model at stages 1-2 (greedy partition).
#include <algorithm>

#include "context.h"

namespace zeroplan::sim::lowering {

Residency model_state_residency(const Plan& plan, const ClusterProfile& cluster, const std::vector<Unit>& units) {
  (void)cluster;
  const Bytes b = bytes_of(plan);
  const int n = plan.data_parallel_size();
  std::int64_t p = 0;
  std::int64_t shard3 = 0;
  for (const Unit& u : units) {
    p += u.params;
    shard3 += u.shard;
  }
  const std::int64_t shard12 = (p + n - 1) / n;
  const std::int64_t opt_bytes = b.master + b.states;
  Residency r;
  const int states = plan.optimizer.states_per_param();
  auto split_states = [&](std::int64_t elems) {
    r.host_state_blocks = b.states > 0 ? states : 0;
    r.host_state_block = b.states > 0 ? elems * (b.states / states) : 0;
  };
  if (plan.offload_model.enabled) {  // everything lives on the host; slices visit the device
    r.host_params = p * b.param;
    r.host_grads = p * b.grad;
    r.host_optimizer = p * opt_bytes;
    split_states(p);
    return r;
  }
  for (const Unit& u : units) r.dev_model_buffers += u.buffer;
  const int stage = plan.zero_stage;
  const std::int64_t opt_elems = stage == 0 ? p : (stage == 3 ? shard3 : shard12);
  const std::int64_t grad_elems = stage <= 1 ? p : (stage == 2 ? shard12 : shard3);
  const std::int64_t param_elems = stage <= 2 ? p : shard3;
  // An offloaded optimizer steps a host copy of the parameter shard (ZeRO-Offload's master on the CPU,
  // fp32 parameters included) unless the parameters themselves live there (stage 3 with offload.params)
  // or a 16-bit plan's fp32 master is that copy.
  const bool host_param_copy = plan.offload.optimizer && b.master == 0 && !(stage == 3 && plan.offload.params);
  (plan.offload.optimizer ? r.host_optimizer : r.dev_optimizer) = opt_elems * (opt_bytes + (host_param_copy ? b.param : 0));
  if (plan.offload.optimizer) split_states(opt_elems);
  if (plan.offload.grads && stage >= 2) {
    r.host_grads = grad_elems * b.grad;
  } else {
    r.dev_grads = grad_elems * b.grad;
    r.dev_grads_transient = stage >= 2;
    // Stage 1 with offloaded grads (the device keeps full grads for the all-reduce), and an offloaded
    // optimizer at stages 1-3 without them: the host optimizer steps a host copy of this rank's final
    // gradients, one block allocated at set-up (ZeRO-Offload's fp32 gradient partition, stage_1_and_2.py
    // initialize_optimizer_states; here in the gradient dtype).
    if (plan.offload.grads) r.host_grads = shard12 * b.grad;
    else if (plan.offload.optimizer && stage >= 1) r.host_grads = opt_elems * b.grad;
  }
  (plan.offload.params && stage == 3 ? r.host_params : r.dev_params) = param_elems * b.param;
  // Offloaded stage 2-3 gradients: each reduce-scattered share (a unit's at stage 3, a reduce_buffer_elems
  // bucket's at stage 2, as dp_sync groups them) lands in a host staging buffer (the largest, in the
  // reduce-scatter dtype) and is added to the host shard from there, so that microbatches accumulate
  // (DeepSpeed's pinned buffers for cpu_offload).
  if (plan.offload.grads && stage >= 2) {
    std::int64_t largest = 0;
    for (const RsBucket& bucket : reduce_scatter_buckets(plan, units)) largest = std::max(largest, bucket.shard);
    r.host_buffers = largest * (plan.precision.fp32_reduce_scatter ? 4 : b.reduce);
  }
  // SlowMo: the slow momentum buffer and the previous parameters, fp32, full size on every rank
  // (fairscale SlowMoDistributedDataParallel with slowmo_memory_efficient=False, as the export writes it).
  if (plan.slowmo()) r.dev_slowmo = 2 * 4 * p;
  return r;
}

std::vector<std::int64_t> Residency::host_blocks() const {
  std::vector<std::int64_t> v = {host_params, host_grads, host_master(), host_buffers};
  v.insert(v.end(), static_cast<std::size_t>(host_state_blocks), host_state_block);
  std::erase_if(v, [](std::int64_t x) { return x <= 0; });
  return v;
}

void place_model_states(Ctx& c) {
  const Residency r = model_state_residency(c.plan, c.cluster, c.units);
  auto put = [&](PoolId pool, std::int64_t bytes, MemCategory cat, NameId name) {
    if (bytes > 0) c.g.resident(pool, bytes, cat, c.label(name));
  };
  put(c.dev, r.dev_params, MemCategory::params, c.n_params);
  if (!r.dev_grads_transient) put(c.dev, r.dev_grads, MemCategory::grads, c.n_grads);
  put(c.dev, r.dev_optimizer, MemCategory::optimizer, c.n_states);
  put(c.dev, r.dev_slowmo, MemCategory::optimizer, c.n_slowmo);
  put(c.dev, r.dev_buffers, MemCategory::buffers, c.n_reduce_buffers);
  put(c.dev, r.dev_model_buffers, MemCategory::buffers, c.n_model_buffers);
  put(c.host, r.host_params, MemCategory::params, c.n_params);
  put(c.host, r.host_grads, MemCategory::grads, c.n_grads);
  put(c.host, r.host_master(), MemCategory::optimizer, c.n_states);
  for (int i = 0; i < r.host_state_blocks; ++i) put(c.host, r.host_state_block, MemCategory::optimizer, c.n_states);
  put(c.host, r.host_buffers, MemCategory::buffers, c.n_reduce_buffers);
  // What the device's libraries hold for the whole process (the profile's GEMM workspaces on CUDA), where
  // the profile was measured on the kind of device simulated.
  if (measured_on_device_kind(c.model, c.cluster)) put(c.dev, c.model.device_library_bytes, MemCategory::overhead, c.n_library);
}

}  // namespace zeroplan::sim::lowering
