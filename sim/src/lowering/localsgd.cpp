// LocalSGD / SlowMo amortisation: every localsgd_frequency steps the parameters are averaged across all
// ranks (an all-reduce of the parameters); every slowmo_frequency steps the slow update runs (an
// elementwise pass over parameters, slow momentum and previous parameters, fp32). The ordinary step
// reduces gradients within the node only (dp_sync.cpp).
#include "context.h"
#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim::lowering {

SyncAmortisation localsgd_amortisation(const Ctx& c) {
  SyncAmortisation a;
  if (!c.plan.localsgd()) return a;
  const double params = static_cast<double>(c.total_params);
  const double average = collective_time(c.cluster, CollOp::all_reduce, params * c.b.param, c.n);
  a.sync_extra_s = average;
  a.amortised_extra_s = average / c.plan.localsgd_frequency;
  if (c.plan.slowmo_frequency > 0) {
    const double update = params * 4.0 * 5.0 / c.cluster.device.mem_bw_bytes_per_s;  // read 3, write 2 fp32
    a.sync_extra_s += update;
    a.amortised_extra_s += update / c.plan.slowmo_frequency;
  }
  return a;
}

}  // namespace zeroplan::sim::lowering
