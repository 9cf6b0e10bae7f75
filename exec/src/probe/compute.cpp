// The probe's compute and optimizer: GEMM rates per dtype against the peak estimated from
// /proc/cpuinfo, and the executor's FlatOptimizer step rate on host-pool buffers.
#include <fmt/format.h>

#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "probe_parts.h"
#include "zeroplan/exec/device.h"
#include "zeroplan/exec/optimizer.h"

namespace zeroplan::exec {

std::optional<double> estimate_peak_fp32_flops(const std::string& cpuinfo, int threads, std::string* how) {
  using probe::cpuinfo_field;
  const std::string mhz_text = cpuinfo_field(cpuinfo, "cpu MHz");
  const std::string flags_text = cpuinfo_field(cpuinfo, "flags");
  if (mhz_text.empty() || flags_text.empty()) return std::nullopt;
  double mhz = 0;
  try {
    mhz = std::stod(mhz_text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (!(mhz > 0)) return std::nullopt;
  std::istringstream in(flags_text);
  std::set<std::string> flags;
  for (std::string f; in >> f;) flags.insert(f);
  const int lanes = flags.count("avx512f") ? 16 : (flags.count("avx") || flags.count("avx2")) ? 8 : 4;
  const char* isa = lanes == 16 ? "avx512f" : lanes == 8 ? "avx/avx2" : "sse";
  const int per_lane = flags.count("fma") ? 2 : 1;
  const int units = 2;
  const double peak = threads * mhz * 1e6 * lanes * per_lane * units;
  if (how != nullptr) {
    *how = fmt::format(
        "{} core(s) x {:.0f} MHz (cpu MHz in /proc/cpuinfo) x {} fp32 lanes ({}) x {} ({}) x {} "
        "FMA units (assumed: two on every x86 core with AVX2 or AVX-512 server parts) = {:.1f} GFLOP/s",
        threads, mhz, lanes, isa, per_lane, per_lane == 2 ? "fma" : "no fma", units, peak / 1e9);
  }
  return peak;
}

namespace probe {
namespace {

struct Gemm {
  double flops_per_s = 0;
  std::int64_t size = 0;
  std::string error;  // why this dtype could not be measured
};

// Achieved FLOP/s of an n x n x n GEMM in `dtype`; flops_per_s 0 and the reason when it cannot run.
Gemm gemm_rate(torch::ScalarType dtype, std::int64_t n, int reps) {
  try {
    auto a = torch::rand({n, n}).to(dtype);
    auto b = torch::rand({n, n}).to(dtype);
    auto c = torch::empty({n, n}, torch::TensorOptions().dtype(dtype));
    const auto t0 = Clock::now();
    torch::mm_out(c, a, b);
    // A dtype that runs at a crawl (no hardware support) gets one sample, not a minute.
    const double first = seconds_since(t0);
    const double t = first > 1.0 ? first : median_s(reps, 0, [&] { torch::mm_out(c, a, b); });
    return {2.0 * static_cast<double>(n * n * n) / t, n, ""};
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    return {0, n, what.substr(0, what.find('\n'))};
  }
}

struct OptRates {
  double per_tensor = 0, flat = 0;  // params/s: many 4096-element segments, one flat segment
};

// The executor's FlatOptimizer over buffers in the host pool (the offloaded optimizer's state; a CPU
// device steps the same kernels on the same memory).
OptRates optimizer_rates(const Optimizer& config, HostPool& pool, const Sizes& s) {
  auto rate = [&](int tensors, std::int64_t numel) {
    std::vector<std::int64_t> segments(static_cast<std::size_t>(tensors), numel);
    auto alloc = [&](std::int64_t n) { return pool.zeros(n); };
    FlatOptimizer opt(config, segments, alloc);
    std::vector<torch::Tensor> params, grads;
    for (int i = 0; i < tensors; ++i) {
      params.push_back(alloc(numel).uniform_(-1, 1));
      grads.push_back(alloc(numel).normal_(0, 1e-3));
    }
    const double t = median_s(s.opt_reps, 1, [&] { opt.step(params, grads); });
    return static_cast<double>(tensors) * static_cast<double>(numel) / t;
  };
  return {rate(s.opt_tensors, 4096), rate(1, s.opt_flat)};
}

}  // namespace

void measure_compute(ClusterProfile& c, const Context& x) {
  const Sizes& s = x.sizes;
  const Machine& m = x.machine;
  const int threads = x.threads;
  const std::string& as_rank = x.as_rank;
  auto measured = [&](const std::string& method) { return x.measured(method); };
  const Gemm fp32 = gemm_rate(torch::kFloat32, s.gemm, s.gemm_reps);
  positive(fp32.flops_per_s, "fp32 GEMM FLOP/s");
  std::string how;
  const std::optional<double> est = estimate_peak_fp32_flops(m.cpuinfo, threads, &how);
  const std::string gemm_how = fmt::format("fp32 GEMM {0}x{0}x{0} (torch::mm_out, 2mnk FLOPs), median of {1}, {2}",
                                           fp32.size, s.gemm_reps, as_rank);
  if (est && *est >= fp32.flops_per_s) {
    c.device.peak_flops["fp32"] = *est;
    c.device.compute_efficiency = fp32.flops_per_s / *est;
    c.provenance["device.peak_flops.fp32"] = Provenance{"estimate", "estimated from /proc/cpuinfo: " + how};
    c.provenance["device.compute_efficiency"] = measured(
        fmt::format("achieved / estimated peak: {} achieved {:.1f} GFLOP/s", gemm_how, fp32.flops_per_s / 1e9));
  } else {
    c.device.peak_flops["fp32"] = fp32.flops_per_s;
    c.device.compute_efficiency = 1.0;
    const std::string why =
        est ? fmt::format(
                  "the GEMM beat the peak estimated from /proc/cpuinfo ({}), so the "
                  "achieved rate is taken as the peak",
                  how)
            : "no clock or SIMD flags in /proc/cpuinfo, so the achieved rate is taken as the peak";
    c.provenance["device.peak_flops.fp32"] = measured(gemm_how + "; " + why);
    c.provenance["device.compute_efficiency"] = measured("1 by definition: " + why);
  }
  std::string low;
  for (const auto& [dtype, name] : {std::pair{torch::kBFloat16, "bf16"}, std::pair{torch::kFloat16, "fp16"}}) {
    const Gemm g = gemm_rate(dtype, s.gemm_low, s.gemm_low_reps);
    if (!(g.flops_per_s > 0)) {
      low += fmt::format(", {} not measured ({})", name, g.error);
      continue;
    }
    c.device.peak_flops[name] = g.flops_per_s / c.device.compute_efficiency;
    c.provenance[std::string("device.peak_flops.") + name] = measured(
        fmt::format("{0} GEMM {1}x{1}x{1} achieved {2:.1f} GFLOP/s (median of {3}, {4}); recorded as achieved / "
                    "compute_efficiency so that peak x efficiency is the achieved rate",
                    name, g.size, g.flops_per_s / 1e9, s.gemm_low_reps, as_rank));
    low += fmt::format(", {} {:.1f}", name, g.flops_per_s / 1e9);
  }
  x.progress(fmt::format("GEMM achieved fp32 {:.1f}{} GFLOP/s; efficiency {:.2f} of peak {:.1f} GFLOP/s",
                       fp32.flops_per_s / 1e9, low, c.device.compute_efficiency, c.device.peak_flops["fp32"] / 1e9));
}

// offload.optimizer, and a CPU device's own step.
void measure_optimizer(ClusterProfile& c, const Context& x, HostPool& host_pool) {
  const Sizes& s = x.sizes;
  const std::string& as_rank = x.as_rank;
  auto measured = [&](const std::string& method) { return x.measured(method); };
  Optimizer adam;
  adam.name = "adam";
  Optimizer sgd;
  sgd.name = "sgd";
  sgd.lr = 0.01;
  sgd.momentum = 0.9;
  std::string line = "optimizer (params/s):";
  for (const auto& [config, name, rate] :
       {std::tuple{&adam, "adam", &c.host.optimizer.adam}, std::tuple{&sgd, "sgd", &c.host.optimizer.sgd}}) {
    const OptRates r = optimizer_rates(*config, host_pool, s);
    rate->per_tensor_params_per_s = positive(r.per_tensor, std::string(name) + " per-tensor rate");
    rate->flat_params_per_s = positive(r.flat, std::string(name) + " flat rate");
    const std::string what = std::string(name) == "adam" ? "Adam (lr 1e-3, betas 0.9/0.999)" : "SGD (momentum 0.9)";
    const std::string common = fmt::format(
        "exec::FlatOptimizer::step (PyTorch's fused {} kernel, in place) on host-pool buffers, {}, median of {} "
        "steps, {}",
        name, what, s.opt_reps, as_rank);
    c.provenance[fmt::format("host.optimizer.{}.per_tensor_params_per_s", name)] =
        measured(fmt::format("{} segments of 4096 fp32 parameters, {}", s.opt_tensors, common));
    c.provenance[fmt::format("host.optimizer.{}.flat_params_per_s", name)] =
        measured(fmt::format("one flat segment of {} fp32 parameters, {}", s.opt_flat, common));
    line += fmt::format(" {} {:.3g} per-tensor / {:.3g} flat;", name, r.per_tensor, r.flat);
  }
  x.progress(line);
}

}  // namespace probe
}  // namespace zeroplan::exec
