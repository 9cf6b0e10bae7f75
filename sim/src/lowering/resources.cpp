// Resources and pools of one rank, and which of them contend (see SharedGroup in task_graph.h):
// on a CPU cluster that shares cores, every resource splits the cores (compute and collectives by the
// probe's measured core_contention when the cluster has it); on GPUs, copies and collectives
// share PCIe when collectives cross nodes (GPUDirect RDMA) or the intra-node link is PCIe itself.
#include <cmath>
#include <numbers>
#include <string>
#include <unordered_map>

#include "context.h"

namespace zeroplan::sim::lowering {

double expected_max_of_normals(int n) {
  if (n <= 1) return 0.0;
  // The tuner simulates thousands of plans over a few rank counts: each value integrated once per thread.
  thread_local std::unordered_map<int, double> known;
  if (const auto it = known.find(n); it != known.end()) return it->second;
  // E[max] = integral of x n phi(x) Phi(x)^(n-1) dx (midpoint rule; the tails beyond 9 sigma add nothing).
  const double h = 1e-3, inv_sqrt2 = 1.0 / std::sqrt(2.0), inv_sqrt2pi = 1.0 / std::sqrt(2.0 * std::numbers::pi);
  double sum = 0;
  for (double x = -9 + h / 2; x < 9; x += h) {
    const double phi = inv_sqrt2pi * std::exp(-0.5 * x * x), cdf = 0.5 * std::erfc(-x * inv_sqrt2);
    sum += x * n * phi * std::pow(cdf, n - 1) * h;
  }
  return known[n] = sum;
}

double rank_skew_fraction(const ModelProfile& model, const ClusterProfile& cluster, int ranks) {
  if (ranks <= 1 || model.rank_skew <= 0 || model.concurrent_ranks <= 1 || !measured_on_device_kind(model, cluster))
    return 0.0;
  // Measured with the profile's concurrent ranks; the last of `ranks` trails their mean by E[max] of as
  // many draws (in units of the spread), so the fraction scales by that ratio.
  return std::min(1.0, model.rank_skew * expected_max_of_normals(ranks) /
                           expected_max_of_normals(model.concurrent_ranks));
}

void build_resources(Ctx& c) {
  const ClusterProfile& cl = c.cluster;
  GroupId cores = kNone;
  GroupId pcie = kNone;
  if (cl.shares_cores) {
    cores = c.g.add_group(c.prefix + "cores", c.opt.cpu_core_capacity);
  } else if (cl.device.kind != "cpu" &&
             (c.n > cl.devices_per_node || cl.links.intra_node.name.find("PCIe") != std::string::npos)) {
    pcie = c.g.add_group(c.prefix + "pcie", c.opt.pcie_capacity);
  }
  const GroupId copy_group = cores != kNone ? cores : pcie;
  // Measured core contention (the probe): compute and collectives each slow by their own factor while
  // anything else runs on the cores, instead of an equal split of the cores.
  const CoreContention& cc = cl.core_contention;
  const bool measured = cores != kNone && cc.measured();
  double compute_rate = measured ? 1.0 / cc.compute_with_comm_slowdown : 0.0;
  double comm_rate = measured ? 1.0 / cc.comm_with_compute_slowdown : 0.0;
  // A GPU's compute and its collectives share the SMs (calibration.compute_with_comm_slowdown): compute
  // slows while a collective is in flight, the collective keeps its speed. Collectives then leave the
  // PCIe group (their contention with offload copies across nodes is not modelled together with this).
  GroupId compute_group = cores, comm_group = copy_group;
  if (cores == kNone && cl.device.kind == "cuda" && cl.calibration.compute_with_comm_slowdown > 1) {
    compute_group = comm_group = c.g.add_group(c.prefix + "sm", 1.0);
    compute_rate = 1.0 / cl.calibration.compute_with_comm_slowdown;
    comm_rate = 1.0;
  }
  c.compute = c.g.add_resource(c.prefix + "compute", ResourceKind::compute, compute_group, compute_rate);
  c.h2d = c.g.add_resource(c.prefix + "h2d", ResourceKind::copy_h2d, copy_group);
  c.d2h = c.g.add_resource(c.prefix + "d2h", ResourceKind::copy_d2h, copy_group);
  c.comm = c.g.add_resource(c.prefix + "comm", ResourceKind::comm, comm_group, comm_rate);
  // FSDP reduce-scatters on its own stream, so gathers for the next unit are not queued behind them.
  c.comm_rs = c.plan.zero_stage == 3 ? c.g.add_resource(c.prefix + "comm.rs", ResourceKind::comm, comm_group, comm_rate)
                                     : c.comm;
  // Ranks that drift apart on shared cores: a collective begins when the last rank issues it.
  if (const double skew = rank_skew_fraction(c.model, cl, c.n); skew > 0) {
    c.g.set_skew(c.comm, c.compute, skew);
    if (c.comm_rs != c.comm) c.g.set_skew(c.comm_rs, c.compute, skew);
  }
  c.host_opt = c.g.add_resource(c.prefix + "host_optimizer", ResourceKind::host_optimizer, cores);
  c.dev = c.g.add_pool(c.prefix + "device", cl.device.mem_bytes);
  // A GPU's host pool is pinned through PyTorch's caching host allocator (power-of-two blocks, cached),
  // as the executor's CudaDevice, DeepSpeed's and FSDP's offload buffers have it; a CPU device's is
  // plain memory of the requested size.
  c.host = c.g.add_pool(c.prefix + "host", cl.host.mem_bytes, cl.device.kind == "cuda");
}

}  // namespace zeroplan::sim::lowering
