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

SyncAmortisation localsgd_amortisation(const Plan& plan, const ClusterProfile& cluster, const std::vector<Unit>& units) {
  SyncAmortisation a;
  if (!plan.localsgd()) return a;
  const int n = plan.data_parallel_size();
  double params = 0, tensors = 0;
  for (const Unit& u : units) {
    params += static_cast<double>(u.params);
    tensors += u.tensors;
  }
  // On one node every step already reduced gradients over every rank: the replicas are equal and, as in
  // fairscale's hierarchy (and the executor), there is nothing to average.
  const bool several_nodes = n > cluster.devices_per_node;
  CollectiveOptions o;
  o.dtype = plan.precision.param_dtype;
  const double average =
      several_nodes ? collective_time(cluster, CollOp::all_reduce, params * bytes_of(plan).param, n, o) : 0.0;
  a.sync_extra_s = average;
  a.amortised_extra_s = average / plan.localsgd_frequency;
  if (plan.slowmo()) {
    const double update = params * 4.0 * (8.0 + 5.0) / cluster.device.mem_bw_bytes_per_s +
                          5.0 * tensors * cluster.device.launch_overhead_s;
    a.sync_extra_s += update;
    a.amortised_extra_s += update / plan.slowmo_frequency;
  }
  return a;
}

SyncAmortisation localsgd_amortisation(const Ctx& c) { return localsgd_amortisation(c.plan, c.cluster, c.units); }

}  // namespace zeroplan::sim::lowering
