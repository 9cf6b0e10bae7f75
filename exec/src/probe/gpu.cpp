// The probe of a GPU (probe_gpu): the device numbers that can be measured on one device, on top of a
// shipped file of the same part. Written against exec::Device, so the same code times a CPU device in
// tests; the CUDA-only facts (name, memory, SMs) come from the CUDA runtime.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "probe_parts.h"
#include "zeroplan/config.h"
#include "zeroplan/exec/device.h"

#if ZEROPLAN_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace zeroplan::exec::probe {
namespace {

// Mean seconds per call of f: `warmup` calls, the device drained, `reps` calls queued back to back, the
// device drained again (a GPU's calls are asynchronous: the host clock around the drained queue times them).
template <class F>
double device_mean_s(Device& dev, int reps, int warmup, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  dev.synchronize();
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) f();
  dev.synchronize();
  return seconds_since(t0) / std::max(1, reps);
}

}  // namespace

GpuFacts gpu_facts(Device& dev) {
  GpuFacts f;
  f.name = dev.name();
#if ZEROPLAN_HAVE_CUDA
  const torch::Device d = dev.torch_device();
  if (d.is_cuda()) {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(d.index());
    f.name = p->name;
    f.mem_bytes = static_cast<std::int64_t>(p->totalGlobalMem);
    f.sm_count = p->multiProcessorCount;
  }
#endif
  return f;
}

void measure_device(ClusterProfile& c, const Context& x, Device& dev) {
  const Sizes& s = x.sizes;
  const torch::TensorOptions on_dev = torch::TensorOptions().device(dev.torch_device());
  const std::int64_t n = s.stream_bytes / 4;
  const double bytes = static_cast<double>(s.stream_bytes);

  auto src = torch::rand({n}, on_dev);
  auto dst = torch::empty({n}, on_dev);
  const double t_copy = device_mean_s(dev, s.stream_reps, 1, [&] { dst.copy_(src); });
  c.device.mem_bw_achieved_bytes_per_s = positive(2 * bytes / t_copy, "device copy bandwidth");
  c.provenance["device.mem_bw_achieved_bytes_per_s"] = x.measured(fmt::format(
      "Tensor::copy_ of {:.0f} MiB fp32 within {} (larger than its cache), bytes read + written per second, mean "
      "of {} copies queued back to back",
      s.stream_bytes / kMiB, dev.name(), s.stream_reps));

  auto tiny = torch::zeros({1}, on_dev);
  const double t_tiny = device_mean_s(dev, s.tiny_ops, 10, [&] { tiny.add_(1.0); });
  c.device.launch_overhead_s = positive(t_tiny, "launch overhead");
  c.provenance["device.launch_overhead_s"] = x.measured(fmt::format(
      "one in-place add on a 1-element tensor on {}, mean of {} queued back to back (dispatch and launch)", dev.name(),
      s.tiny_ops));

  // Host copies each way: from the host pool (pinned on CUDA: the caching host allocator) and from a
  // plain (pageable) host tensor.
  auto pinned = dev.host_pool().zeros(n);
  auto pageable = torch::zeros({n});
  auto on_device = torch::empty({n}, on_dev);
  struct Copy {
    double* to;
    const char* path;
    const char* what;
    std::function<void()> run;
  };
  const std::vector<Copy> copies = {
      {&c.host.bw_h2d_pinned_bytes_per_s, "host.bw_h2d_pinned_bytes_per_s", "host pool (pinned) to device",
       [&] { dev.copy_h2d(on_device, pinned); }},
      {&c.host.bw_d2h_pinned_bytes_per_s, "host.bw_d2h_pinned_bytes_per_s", "device to host pool (pinned)",
       [&] { dev.copy_d2h(pinned, on_device); }},
      {&c.host.bw_h2d_pageable_bytes_per_s, "host.bw_h2d_pageable_bytes_per_s", "pageable host tensor to device",
       [&] { on_device.copy_(pageable); }},
      {&c.host.bw_d2h_pageable_bytes_per_s, "host.bw_d2h_pageable_bytes_per_s", "device to pageable host tensor",
       [&] { pageable.copy_(on_device); }},
  };
  std::string line = "copies:";
  for (const Copy& k : copies) {
    *k.to = positive(bytes / device_mean_s(dev, s.stream_reps, 1, k.run), k.path);
    c.provenance[k.path] = x.measured(fmt::format("{:.0f} MiB fp32 {}, bytes per second, mean of {} queued back to back",
                                                  s.stream_bytes / kMiB, k.what, s.stream_reps));
    line += fmt::format(" {} {};", k.path + 8, gbps(*k.to));
  }
  x.progress(fmt::format("{}: copy {}, launch {:.2f} us; {}", dev.name(), gbps(c.device.mem_bw_achieved_bytes_per_s),
                         c.device.launch_overhead_s * 1e6, line));
}

std::map<std::string, std::vector<GemmRate>> measure_gemm_sweep(const Context& x, Device& dev,
                                                                  const std::vector<std::string>& dtypes) {
  const Sizes& s = x.sizes;
  std::map<std::string, std::vector<GemmRate>> out;
  for (const std::string& dtype : dtypes) {
    const torch::ScalarType t = dtype == "bf16" ? torch::kBFloat16 : dtype == "fp16" ? torch::kHalf : torch::kFloat32;
    const torch::TensorOptions opts = torch::TensorOptions().device(dev.torch_device()).dtype(t);
    std::string line = fmt::format("GEMM {} m = n = k:", dtype);
    for (std::int64_t m : s.gemm_sweep) {
      // Random operands (zeros run faster on some GPUs); C written in place, as a layer's output is.
      auto a = torch::randn({m, m}, opts);
      auto b = torch::randn({m, m}, opts);
      auto cm = torch::empty({m, m}, opts);
      const double first = device_mean_s(dev, 1, 1, [&] { torch::mm_out(cm, a, b); });
      // About a tenth of a second of products, at least 3 and at most 200.
      const int reps = static_cast<int>(std::clamp(0.1 / std::max(first, 1e-9), 3.0, 200.0));
      const double sec = first > 1.0 ? first : device_mean_s(dev, reps, 2, [&] { torch::mm_out(cm, a, b); });
      const double flops = positive(2.0 * static_cast<double>(m) * m * m / sec, "GEMM rate");
      out[dtype].push_back({m, m, m, flops, first > 1.0 ? 1 : reps});
      line += fmt::format(" {} {:.1f} TFLOP/s;", m, flops / 1e12);
    }
    x.progress(line);
  }
  return out;
}

}  // namespace zeroplan::exec::probe
