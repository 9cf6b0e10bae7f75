// LocalSGD / SlowMo amortisation: every localsgd_frequency steps the parameters are averaged across all
// ranks (an all-reduce of the parameters); every slowmo_frequency steps, when SlowMo is on
// (Plan::slowmo()), the slow update runs on every rank: fairscale's per-tensor update
//   u = m u - p / lr + old / lr;  old -= lr * slowmo_lr * u;  p = old
// five fp32 elementwise kernels per parameter tensor reading 8 and writing 5 buffers of P elements. The
// ordinary step reduces gradients within the node only (dp_sync.cpp). The localsgd_warmup_steps
// fully synchronous steps before LocalSGD starts are a one-off, not in the amortised step: simulate.cpp
// reports their time beside it.
#include "context.h"
#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim::lowering {

SyncAmortisation localsgd_amortisation(const Ctx& c) {
  SyncAmortisation a;
  if (!c.plan.localsgd()) return a;
  const double params = static_cast<double>(c.total_params);
  // On one node every step already reduced gradients over every rank: the replicas are equal and, as in
  // fairscale's hierarchy (and the executor), there is nothing to average.
  const bool several_nodes = c.n > c.cluster.devices_per_node;
  CollectiveOptions o;
  o.dtype = c.plan.precision.param_dtype;
  const double average = several_nodes ? collective_time(c.cluster, CollOp::all_reduce, params * c.b.param, c.n, o) : 0.0;
  a.sync_extra_s = average;
  a.amortised_extra_s = average / c.plan.localsgd_frequency;
  if (c.plan.slowmo()) {
    double tensors = 0;
    for (const Unit& u : c.units) tensors += u.tensors;
    const double update = params * 4.0 * (8.0 + 5.0) / c.cluster.device.mem_bw_bytes_per_s +
                          5.0 * tensors * c.cluster.device.launch_overhead_s;
    a.sync_extra_s += update;
    a.amortised_extra_s += update / c.plan.slowmo_frequency;
  }
  return a;
}

}  // namespace zeroplan::sim::lowering
