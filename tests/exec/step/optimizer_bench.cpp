// The flat-buffer optimizer step (exec::FlatOptimizer) against per-tensor Adam on a model of many
// small tensors of 1024-4096 fp32 elements, same total numel, same math (Adam lr 1e-3, betas
// 0.9/0.999, eps 1e-8). The last argument of every Adam benchmark is the number of tensors: 2000
// (5.1M parameters, 20 MiB per buffer, 80 MiB for p, g, m, v: twice the last-level cache) and 20000
// (51M parameters, 800 MiB: DRAM-bound).
//
//   BM_Bandwidth/0|1         the machine's memory bandwidth, 256 MiB fp32: dst.copy_(src) (bytes read +
//                            written) | dst.add_(src) (read 2, write 1 in place: Adam's access pattern)
//   BM_FlatAdam              zeroplan's FlatOptimizer, one flat segment (what the executor steps)
//   BM_SegmentedAdam         the same, one segment per tensor (per-tensor overhead alone)
//   BM_TorchOptimAdam        torch::optim::Adam over the tensors (per-tensor, libtorch's C++ optimizer)
//   BM_ForeachAdam           the same math as _foreach ops (torch.optim.Adam(foreach=True)'s kernels)
//   BM_FusedAdam/0|1         at::_fused_adam_ (torch.optim.Adam(fused=True)'s kernel): over the tensors
//                            | over one flat tensor
//
// Counters: params_per_s; bytes_per_s = Adam's minimum traffic (read p, g, m, v; write p, m, v:
// 28 bytes per fp32 parameter) per second of wall time; frac_copy_bw and frac_add_bw = bytes_per_s /
// BM_Bandwidth's two figures (measured once per process, median of 7, same threads).
// Run with OMP_NUM_THREADS=1 for one rank's share (what the executor benchmark gives each rank):
//   OMP_NUM_THREADS=1 build-step/tests/exec/optimizer_bench
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "zeroplan/exec/optimizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using zeroplan::exec::FlatOptimizer;

constexpr std::int64_t kMinNumel = 1024;
constexpr std::int64_t kMaxNumel = 4096;
constexpr double kAdamBytesPerParam = 7.0 * sizeof(float);
constexpr std::int64_t kCopyBytes = 256LL << 20;

// `count` deterministic sizes in [kMinNumel, kMaxNumel].
std::vector<std::int64_t> tensor_sizes(std::int64_t count) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t i = 0; i < count; ++i) {
    sizes.push_back(kMinNumel + static_cast<std::int64_t>((static_cast<std::uint64_t>(i) * 2654435761ULL) %
                                                          static_cast<std::uint64_t>(kMaxNumel - kMinNumel + 1)));
  }
  return sizes;
}

std::int64_t total(const std::vector<std::int64_t>& sizes) {
  std::int64_t n = 0;
  for (std::int64_t s : sizes) n += s;
  return n;
}

double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Bytes moved per second over two kCopyBytes fp32 tensors, median of 7 after one untimed pass.
// add = false: dst.copy_(src), 2 x kCopyBytes (read + write); true: dst.add_(src), 3 x kCopyBytes.
double bandwidth(bool add) {
  torch::Tensor src = torch::rand({kCopyBytes / 4});
  torch::Tensor dst = torch::zeros_like(src);
  auto pass = [&] { add ? dst.add_(src) : dst.copy_(src); };
  pass();
  std::vector<double> t;
  for (int i = 0; i < 7; ++i) {
    const auto t0 = Clock::now();
    pass();
    t.push_back(seconds(t0));
  }
  std::sort(t.begin(), t.end());
  return (add ? 3.0 : 2.0) * static_cast<double>(kCopyBytes) / t[t.size() / 2];
}
double copy_bandwidth() {
  static const double bw = bandwidth(false);
  return bw;
}
double add_bandwidth() {
  static const double bw = bandwidth(true);
  return bw;
}

// Times `step` once per iteration (wall clock) and sets the counters for `numel` parameters.
template <typename F>
void run_steps(benchmark::State& state, std::int64_t numel, F&& step) {
  step();  // untimed first step: lazy state, first-touch page faults
  double elapsed = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    step();
    elapsed += seconds(t0);
  }
  const double steps_per_s = static_cast<double>(state.iterations()) / elapsed;
  const double bytes_per_s = steps_per_s * static_cast<double>(numel) * kAdamBytesPerParam;
  state.counters["params"] = static_cast<double>(numel);
  state.counters["params_per_s"] = steps_per_s * static_cast<double>(numel);
  state.counters["bytes_per_s"] = bytes_per_s;
  state.counters["frac_copy_bw"] = bytes_per_s / copy_bandwidth();
  state.counters["frac_add_bw"] = bytes_per_s / add_bandwidth();
}

struct Buffers {
  std::vector<torch::Tensor> params, grads;
};

// One tensor per size, or one flat tensor of the total (grads random, fixed across steps).
Buffers make_buffers(const std::vector<std::int64_t>& sizes, bool flat) {
  torch::manual_seed(0);
  Buffers b;
  const std::vector<std::int64_t> shapes = flat ? std::vector<std::int64_t>{total(sizes)} : sizes;
  for (std::int64_t n : shapes) {
    b.params.push_back(torch::randn({n}) * 0.02);
    b.grads.push_back(torch::randn({n}) * 1e-3);
  }
  return b;
}

void BM_Bandwidth(benchmark::State& state) {
  const bool add = state.range(0) == 1;
  torch::Tensor src = torch::rand({kCopyBytes / 4});
  torch::Tensor dst = torch::zeros_like(src);
  auto pass = [&] { add ? dst.add_(src) : dst.copy_(src); };
  pass();
  double elapsed = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    pass();
    elapsed += seconds(t0);
  }
  state.counters["bytes_per_s"] =
      (add ? 3.0 : 2.0) * static_cast<double>(kCopyBytes) * static_cast<double>(state.iterations()) / elapsed;
  state.counters["threads"] = static_cast<double>(at::get_num_threads());
}
BENCHMARK(BM_Bandwidth)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// zeroplan's optimizer over one flat segment or one segment per tensor; arg: tensors.
void zeroplan_adam(benchmark::State& state, bool flat) {
  const std::vector<std::int64_t> sizes = tensor_sizes(state.range(0));
  Buffers b = make_buffers(sizes, flat);
  std::vector<std::int64_t> segments;
  for (const auto& p : b.params) segments.push_back(p.numel());
  FlatOptimizer opt(zeroplan::Optimizer{}, segments, [](std::int64_t n) { return torch::zeros({n}); });
  run_steps(state, total(sizes), [&] { opt.step(b.params, b.grads); });
  state.counters["tensors"] = static_cast<double>(b.params.size());
}

void BM_FlatAdam(benchmark::State& state) { zeroplan_adam(state, /*flat=*/true); }
BENCHMARK(BM_FlatAdam)->Arg(2000)->Arg(20000)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_SegmentedAdam(benchmark::State& state) { zeroplan_adam(state, /*flat=*/false); }
BENCHMARK(BM_SegmentedAdam)->Arg(2000)->Arg(20000)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_TorchOptimAdam(benchmark::State& state) {
  const std::vector<std::int64_t> sizes = tensor_sizes(state.range(0));
  Buffers b = make_buffers(sizes, /*flat=*/false);
  std::vector<torch::Tensor> params;
  for (std::size_t i = 0; i < b.params.size(); ++i) {
    params.push_back(b.params[i].clone().requires_grad_(true));
    params.back().mutable_grad() = b.grads[i];
  }
  torch::optim::Adam opt(params, torch::optim::AdamOptions(1e-3).betas({0.9, 0.999}).eps(1e-8).weight_decay(0));
  run_steps(state, total(sizes), [&] { opt.step(); });
  state.counters["tensors"] = static_cast<double>(params.size());
}
BENCHMARK(BM_TorchOptimAdam)->Arg(2000)->Arg(20000)->Unit(benchmark::kMillisecond)->UseRealTime();

// torch.optim.Adam's _multi_tensor_adam (foreach=True), without the Python around it.
void BM_ForeachAdam(benchmark::State& state) {
  const std::vector<std::int64_t> sizes = tensor_sizes(state.range(0));
  Buffers b = make_buffers(sizes, /*flat=*/false);
  std::vector<torch::Tensor> m, v;
  for (const auto& p : b.params) {
    m.push_back(torch::zeros_like(p));
    v.push_back(torch::zeros_like(p));
  }
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  std::int64_t step = 0;
  run_steps(state, total(sizes), [&] {
    torch::NoGradGuard no_grad;
    ++step;
    const double bc1 = 1 - std::pow(b1, static_cast<double>(step));
    const double bc2 = 1 - std::pow(b2, static_cast<double>(step));
    at::_foreach_lerp_(m, b.grads, 1 - b1);
    at::_foreach_mul_(v, b2);
    at::_foreach_addcmul_(v, b.grads, b.grads, 1 - b2);
    std::vector<torch::Tensor> denom = at::_foreach_sqrt(v);
    at::_foreach_div_(denom, std::sqrt(bc2));
    at::_foreach_add_(denom, eps);
    at::_foreach_addcdiv_(b.params, m, denom, -lr / bc1);
  });
  state.counters["tensors"] = static_cast<double>(b.params.size());
}
BENCHMARK(BM_ForeachAdam)->Arg(2000)->Arg(20000)->Unit(benchmark::kMillisecond)->UseRealTime();

// torch.optim.Adam(fused=True)'s kernel; args: 0 over the tensors | 1 over one flat tensor, tensors.
void BM_FusedAdam(benchmark::State& state) {
  const std::vector<std::int64_t> sizes = tensor_sizes(state.range(1));
  Buffers b = make_buffers(sizes, /*flat=*/state.range(0) == 1);
  std::vector<torch::Tensor> m, v, steps;
  for (const auto& p : b.params) {
    m.push_back(torch::zeros_like(p));
    v.push_back(torch::zeros_like(p));
    steps.push_back(torch::zeros({}));
  }
  run_steps(state, total(sizes), [&] {
    torch::NoGradGuard no_grad;
    at::_foreach_add_(steps, 1);
    at::_fused_adam_(b.params, b.grads, m, v, {}, steps, 1e-3, 0.9, 0.999, 0.0, 1e-8, /*amsgrad=*/false,
                     /*maximize=*/false);
  });
  state.counters["tensors"] = static_cast<double>(b.params.size());
}
BENCHMARK(BM_FusedAdam)->ArgsProduct({{0, 1}, {2000, 20000}})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
