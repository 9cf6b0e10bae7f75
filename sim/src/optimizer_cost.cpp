// Optimizer cost: host throughput in parameters per second; on a GPU, a memory-bound pass plus launches.
#include <algorithm>

#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim {

namespace {
// Per-tensor Adam as torch ops: two moment updates, bias corrections, the parameter update. A flat
// buffer is stepped by one fused kernel (zeroplan's executor, torch.optim's fused=True).
constexpr int kKernelsPerStep = 5;
}

double host_optimizer_time(const ClusterProfile& c, std::string_view optimizer, double params, bool flat) {
  if (params <= 0) return 0.0;
  const OptimizerRate& r = optimizer == "sgd" ? c.host.optimizer.sgd : c.host.optimizer.adam;
  double rate = flat ? r.flat_params_per_s : r.per_tensor_params_per_s;
  if (rate <= 0) rate = std::max(r.flat_params_per_s, r.per_tensor_params_per_s);
  return params / rate;
}

double device_optimizer_time(const ClusterProfile& c, std::string_view optimizer, double params,
                             double bytes_touched, int tensors, bool flat) {
  if (params <= 0) return 0.0;
  if (c.device.kind == "cpu") return host_optimizer_time(c, optimizer, params, flat);
  const int launches = flat ? 1 : kKernelsPerStep * std::max(1, tensors);
  return bytes_touched / c.device.mem_bw_bytes_per_s + launches * c.device.launch_overhead_s;
}

}  // namespace zeroplan::sim
