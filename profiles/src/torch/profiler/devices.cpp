// The devices a profile measures on: the dtype and device named in the options, the memory meter,
// timers and synchronisation of each, and moving a model there.
#include <torch/torch.h>
#include <zeroplan/config.h>

#include "internal.h"
#include "zeroplan/profiles/errors.h"

namespace zeroplan::detail {
namespace {

class CpuMemoryMeter final : public MemoryMeter {
 public:
  explicit CpuMemoryMeter(CountingAllocator& a) : a_(a) {}
  std::int64_t begin_phase() override { return a_.reset_peak(); }
  std::int64_t live() const override { return a_.live_bytes(); }
  std::int64_t peak() const override { return a_.peak_bytes(); }

 private:
  CountingAllocator& a_;
};

}  // namespace

torch::Dtype parse_dtype(const std::string& dtype) {
  if (dtype == "fp32") return torch::kFloat32;
  if (dtype == "fp16") return torch::kFloat16;
  if (dtype == "bf16") return torch::kBFloat16;
  throw SchemaError("profile: dtype '" + dtype + "' is not one of fp32, fp16, bf16");
}

torch::Device parse_device(const std::string& device) {
  if (device == "cpu") return torch::Device(torch::kCPU);
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
#if ZEROPLAN_HAVE_CUDA
    if (!torch::cuda::is_available()) {
      throw SchemaError("profile: device '" + device + "' but no CUDA device is visible");
    }
    return device == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(device);
#else
    throw SchemaError("profile: device '" + device + "' but this build of zeroplan has no CUDA");
#endif
  }
  throw SchemaError("profile: device '" + device + "' is not cpu, cuda or cuda:N");
}

std::vector<std::int64_t> shape_of(const torch::Tensor& t) { return t.sizes().vec(); }

double tensor_bytes(const torch::Tensor& t) {
  return static_cast<double>(t.numel()) * static_cast<double>(t.element_size());
}

void reset_grads(const std::vector<torch::Tensor>& params) {
  for (const auto& p : params) p.mutable_grad() = torch::Tensor();
}

DeviceContext::DeviceContext(const torch::Device& device) {
  if (device.is_cpu()) {
    scoped_.emplace();
    memory_ = std::make_unique<CpuMemoryMeter>(scoped_->allocator());
    timer_ = std::make_unique<WallTimer>();
    synchronize_ = [] {};
  } else {
#if ZEROPLAN_HAVE_CUDA
    memory_ = make_cuda_memory_meter(device.index());
    timer_ = make_cuda_event_timer();
    synchronize_ = [] { cuda_synchronize(); };
#if ZEROPLAN_HAVE_CUPTI
    kernel_timer_ = make_cupti_kernel_timer();
#endif
#else
    TORCH_INTERNAL_ASSERT(false, "CUDA device without CUDA support");
#endif
  }
}

void validate_options(const ProfileOptions& o) {
  if (o.batch < 1) throw SchemaError("profile: batch " + std::to_string(o.batch) + " < 1");
  for (int b : o.batches) {
    if (b < 1) throw SchemaError("profile: batches contains " + std::to_string(b) + " < 1");
  }
  if (o.warmup < 0) throw SchemaError("profile: warmup " + std::to_string(o.warmup) + " < 0");
  if (o.repeats < 1) throw SchemaError("profile: repeats " + std::to_string(o.repeats) + " < 1");
  if (o.threads < 0) throw SchemaError("profile: threads " + std::to_string(o.threads) + " < 0");
  if (o.concurrent_ranks < 1 || o.concurrent_ranks > 256)
    throw SchemaError("profile: concurrent_ranks " + std::to_string(o.concurrent_ranks) + " is not in 1..256");
}

void move_module(torch::nn::Module& module, const torch::Device& device, torch::Dtype dtype) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    p.set_data(p.is_floating_point() ? p.to(device, dtype) : p.to(device));
  }
  for (auto& b : module.buffers()) {
    b.set_data(b.is_floating_point() ? b.to(device, dtype) : b.to(device));
  }
}

}  // namespace zeroplan::detail
