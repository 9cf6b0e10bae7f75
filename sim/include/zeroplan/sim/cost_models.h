// Cost models: how long one piece of work takes on a ClusterProfile, each a closed form. One source
// file per model (compute_cost.cpp, collective_cost.cpp, copy_cost.cpp, optimizer_cost.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/model_profile.h"

namespace zeroplan::sim {

// Bytes per element of "fp32" | "fp16" | "bf16". REQUIRES: a known dtype.
int dtype_bytes(std::string_view dtype);

// ---- compute ---------------------------------------------------------------------------------------

// Parameter tensors of one repetition of a unit. The ModelProfile does not carry it, so it is estimated
// from the unit type (a transformer block has 12: 2 LayerNorms, QKV, projection, 2 MLP linears, each
// weight + bias; its Attention and MLP halves 6 each); it only sets launch overheads.
int param_tensors(const UnitProfile& unit);

// Where the time of a unit's ops goes (kernel time per category, and launches).
struct ComputeParts {
  double gemm_s = 0;
  double attention_s = 0;
  double memory_s = 0;  // memory-bound kernels (LayerNorm, softmax, GELU, dropout, adds, casts)
  double launch_s = 0;  // kernels x device.launch_overhead_s
  int kernels = 0;
  double total_s() const { return gemm_s + attention_s + memory_s + launch_s; }
  ComputeParts& operator+=(const ComputeParts& o);
};

struct ComputeTime {
  double fwd_s = 0;
  double bwd_s = 0;
  bool from_profile = false;  // measured times used (else a model)
  bool from_ops = false;      // summed over the unit's ops (then fwd_parts and bwd_parts say where)
  ComputeParts fwd_parts;
  ComputeParts bwd_parts;
};

// One repetition of `unit` at `micro_batch` in `compute_dtype`. Uses the profile's measured times when
// the profile was measured on the cluster's device kind (cpu / cuda), scaled by the ratio of peak FLOP/s
// when the compute dtype differs from the profiled one. Otherwise, when the unit lists its ops
// (UnitProfile::ops), the sum of op_time over them. Otherwise a roofline:
//   t = max(flops / (peak_flops[dtype] x compute_efficiency), bytes / mem_bw) + kernels x launch_overhead
// with bytes = parameters in dtype + output + saved activations (backward: twice that), kernels =
// param_tensors (backward: twice). Throws SimError when the unit has neither times nor FLOPs.
ComputeTime unit_compute_time(const ModelProfile& model, int unit_index, const ClusterProfile& cluster,
                              double micro_batch, std::string_view compute_dtype);

// ---- compute per op (units without measured times that list their ops) ------------------------------
// e = dtype_bytes(dtype); bw = device.mem_bw_achieved_bytes_per_s, or mem_bw_bytes_per_s when 0;
// peak = peak_flops[dtype] (fp32 when the dtype has none).

// Achieved efficiency of an (m, n, k) GEMM in `dtype`: the last row of device.gemm.efficiency[dtype] with
// m >= m_min, n >= n_min, k >= k_min; device.compute_efficiency when the device has no table for dtype.
double gemm_efficiency(const DeviceSpec& device, std::string_view dtype, double m, double n, double k);

// Kernel time of `batch` GEMMs C[m,n] = A[m,k] B[k,n] (no launch), with tile and wave quantisation:
//   tm = min(tile_m, m rounded up to 16), tn = min(tile_n, n rounded up to 16)   (a smaller tile for a
//        smaller matrix)
//   tiles = batch x ceil(m / tm) x ceil(n / tn),  waves = ceil(tiles / sm_count)
//   math  = 2 x waves x sm_count x tm x tn x k / (peak x gemm_efficiency(m, n, k))
//           (no tile model, sm_count 0: 2 x batch x m x n x k / (peak x gemm_efficiency))
//   t     = max(math, e x batch x (m k + k n + m n) / bw)
double gemm_time(const ClusterProfile& cluster, std::string_view dtype, double m, double n, double k, double batch = 1);

// One measured or published GEMM: C[m,n] = A[m,k] B[k,n] at flops_per_s = 2mnk / its time.
struct GemmPoint {
  double m = 0, n = 0, k = 0;
  double flops_per_s = 0;
};

// The efficiency table that makes gemm_time reproduce `points` on `cluster` (its peak, SMs and tiles):
// the boundaries of `buckets` (their efficiencies are replaced), each bucket's efficiency the geometric
// mean, capped at 1, over its points of the efficiency the tile and wave model needs for that point
// (the compute-bound time at efficiency 1 over the measured time). A bucket no point falls in keeps its
// efficiency. Used for the shipped tables (profiles/data/microbenchmarks/gemm_sweeps.json) and by
// `probe --device cuda`. Throws SimError when `buckets` is empty or a point is not positive.
std::vector<GemmBucket> fit_gemm_buckets(const ClusterProfile& cluster, std::string_view dtype,
                                         std::vector<GemmBucket> buckets, const std::vector<GemmPoint>& points);

// Time of one op forward or backward, its sizes scaled by `batch_scale` (micro batch / profile batch):
//   gemm       fwd gemm_time(m, n, k), 1 kernel; bwd gemm_time(m, k, n) + gemm_time(k, n, m), 2 kernels,
//              + with bias: the column sum e x m x n / bw, 1 kernel
//   attention  fused: flops = 4 x batch x m x n x k, halved when causal; fwd max(flops / (peak x
//              fused_fwd_efficiency), e x batch x (2mk + 2nk) / bw), 1 kernel; bwd max(2.5 flops /
//              (peak x fused_bwd_efficiency), 2 x that many bytes / bw), 2 kernels (efficiency 0: the
//              largest GEMM bucket's). Unfused: the GEMMs (m, n, k) and (m, k, n) as above, the softmax
//              e x batch x m x n x (fwd 2, bwd 3) / bw, dropout (e x 2 + 1) x batch x m x n / bw each
//              way; kernels fwd 3 (+1 dropout), bwd 5 (+1 dropout). All of it counts as attention.
//   memory     (e x elems + bytes) / bw, kernels_fwd / kernels_bwd kernels
// Each kernel adds device.launch_overhead_s (ComputeParts::launch_s).
ComputeParts op_time(const ClusterProfile& cluster, const UnitOp& op, double batch_scale, std::string_view dtype,
                     bool backward);

// True when `model` was measured on the kind of device `cluster` has.
bool measured_on_device_kind(const ModelProfile& model, const ClusterProfile& cluster);

// What every compute task's time is multiplied by: calibration.compute_time_scale, times the probe's
// core_contention.compute_ranks_slowdown when the profile timed its units one rank alone
// (concurrent_ranks 1; a profile taken with the run's ranks computing at once already has it).
double compute_time_factor(const ModelProfile& model, const ClusterProfile& cluster);

// ---- collectives -----------------------------------------------------------------------------------

enum class CollOp { all_reduce, all_gather, reduce_scatter, broadcast, reduce };
enum class CollAlgo { ring, tree, best };  // best: the faster of ring and tree for this size
std::string_view to_string(CollOp op);

// nccl-tests conventions: `bytes` is the per-rank buffer ("size"): the full buffer for all-reduce,
// broadcast and reduce, the gathered output for all-gather, the input for reduce-scatter.
// Ring on n ranks, link bandwidth B, latency alpha:
//   all_reduce      2(n-1)/n x S/B + 2(n-1) alpha
//   all_gather      (n-1)/n x S/B + (n-1) alpha          reduce_scatter: the same
//   broadcast/reduce  S/B + (n-1) alpha                  (pipelined chain)
// Tree (double binary tree): all_reduce 2 S/B + 2 ceil(log2 n) alpha; broadcast/reduce S/B + ceil(log2 n)
// alpha; all-gather and reduce-scatter have no tree form and use the ring.
// busbw factor (busbw = algbw x factor): all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n,
// broadcast and reduce 1.
double bus_factor(CollOp op, int ranks);
double collective_time_flat(CollOp op, double bytes, int ranks, double bw_bytes_per_s, double alpha_s,
                            CollAlgo algo = CollAlgo::ring);

struct CollectiveOptions {
  CollAlgo algo = CollAlgo::ring;
  std::string backend;  // "nccl" | "gloo" | "shm"; "" = default_backend
  std::string dtype = "fp32";  // the elements reduced: a fit measured with this dtype wins
};

// Time of one collective over `ranks` consecutive ranks of `cluster` (ranks fill nodes first).
// A CollectiveFit for this op, backend, scope and world size wins: its measured points interpolated
// (alpha + beta x bytes when it has none); of those, the fit measured with the options' dtype, else one
// for any dtype. Otherwise
// derived from the links: within a node the intra-node link; across m nodes of d devices hierarchical:
// the intra-node phase on d ranks (NVLink) plus the inter-node phase on m nodes, where the node's
// inter-node bandwidth is shared by its d devices (all_reduce: intra reduce-scatter + inter all-reduce
// + intra all-gather). Gloo's reduce-scatter is zeroplan's ring (the executor's), costed as a ring.
// Multiplied by the cluster's calibration.comm_time_scale.
double collective_time(const ClusterProfile& cluster, CollOp op, double bytes, int ranks,
                       const CollectiveOptions& options = {});

// A lower bound of the summed collective_time of any collectives `op` over `ranks` whose bytes add up to
// `bytes` (buckets of any sizes, any CollAlgo, the default backend, elements of `dtype`), for the tuner's
// step-time bound: from the links, one collective of the total (their time is concave in the bytes);
// from fits, the total at the fits' least time per byte (a fit need not be concave); 0 when a fit has a
// negative time.
double collective_time_lower_bound(const ClusterProfile& cluster, CollOp op, double bytes, int ranks,
                                   std::string_view dtype);

// The backend the cluster uses: "nccl" on cuda devices; on cpu "shm" where the probe measured its
// collectives through shared memory (its fits say so), else "gloo".
std::string_view default_backend(const ClusterProfile& cluster);

// Extra buffers one reduce-scatter of `bytes` input over `ranks` holds from its issue to its wait: Gloo
// (zeroplan's ring of send/recv steps) the chunk received, and with more than two ranks the running sum
// sent on: bytes / ranks x (1 or 2); NCCL: 0.
std::int64_t reduce_scatter_temp_bytes(const ClusterProfile& cluster, std::int64_t bytes, int ranks);

// ---- copies ----------------------------------------------------------------------------------------

enum class CopyDir { h2d, d2h };
// bytes / bandwidth (pinned or pageable, per direction) + the PCIe link latency.
double copy_time(const ClusterProfile& cluster, CopyDir dir, double bytes, bool pinned = true);

// ---- point to point ---------------------------------------------------------------------------------
// One send of `bytes` between two ranks: latency + bytes / bandwidth on the intra-node link, or on the
// node's inter-node link shared by its devices_per_node devices (every device of a node sends at once);
// x calibration.comm_time_scale. 0 for 0 bytes.
double p2p_time(const ClusterProfile& cluster, double bytes, bool same_node);

// ---- optimizer -------------------------------------------------------------------------------------

// Host optimizer step over `params` parameters: params / rate, the rate for Adam (adam, adamw) or SGD,
// flat buffer or per tensor.
double host_optimizer_time(const ClusterProfile& cluster, std::string_view optimizer, double params, bool flat);

// Device optimizer step: on a cpu device the host rates above; on a GPU memory-bound, reading and
// writing every byte of params, grads and states once, plus launches: per tensor 5 kernels per tensor,
// flat 5 kernels.
double device_optimizer_time(const ClusterProfile& cluster, std::string_view optimizer, double params,
                             double bytes_touched, int tensors, bool flat);

}  // namespace zeroplan::sim
