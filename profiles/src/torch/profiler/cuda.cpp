// The CUDA side of the profiler: caching-allocator statistics, CUDA-event timing, CUPTI kernel time.
// Compiled only with ZEROPLAN_HAVE_CUDA (and the CUPTI part with ZEROPLAN_HAVE_CUPTI).
#include "device.h"
#include "zeroplan/profiles/cuda_init.h"
#include "zeroplan/profiles/saved_tensors.h"

#if ZEROPLAN_HAVE_CUDA

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/autograd/engine.h>

#include <c10/core/AutogradState.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstddef>
#include <cstdlib>
#include <mutex>

#if ZEROPLAN_HAVE_CUPTI
#include <cupti.h>
#endif

namespace zeroplan {

namespace {

// Reads an engine's per-device queue count (a protected member) for the note below.
struct EnginePeek : torch::autograd::Engine {
  static std::size_t device_queues(const torch::autograd::Engine& e) {
    auto member = &EnginePeek::device_ready_queues_;
    return (e.*member).size();
  }
};

// One backward of a CUDA tensor on this thread, through the engine zeroplan's runs use (the saved-tensor
// hooks' engine: a Scope installs it, saved_tensors.h); "" when it ran, else torch's message.
std::string try_cuda_backward() {
  try {
    torch::AutoGradMode grad(true);
    saved_tensors::Recorder recorder;
    saved_tensors::Scope scope(recorder);
    auto x = torch::ones({2}, torch::TensorOptions().device(torch::kCUDA).requires_grad(true));
    auto y = (x * x).sum();
    torch::autograd::backward({y}, {torch::ones_like(y)});
    return x.grad().defined() ? "" : "the gradient stayed undefined";
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
}

// Once per process: a backward through the engine in use; when it fails, one note naming what the engines
// hold, then the same backward on the calling thread, which must run.
void check_cuda_backward() {
  static const bool checked = [] {
    const std::string first = try_cuda_backward();
    if (first.empty()) return true;
    const auto& base = torch::autograd::Engine::get_base_engine();
    const auto& used = torch::autograd::Engine::get_default_engine();
    const auto probe = torch::ones({1}, torch::TensorOptions().device(torch::kCUDA));
    std::fprintf(stderr,
                 "%s\n",
                 fmt::format("zeroplan: note: a backward on CUDA failed in torch's autograd engine ({}); torch's base "
                             "engine holds {} CUDA queue(s), the engine in use {}, c10::cuda::device_count() {}, a new tensor's device {}; backward "
                             "runs on the calling thread from now on (autograd multithreading off)",
                             first.substr(0, first.find('\n')), EnginePeek::device_queues(base), EnginePeek::device_queues(used),
                             static_cast<int>(c10::cuda::device_count()), probe.device().str())
                     .c_str());
    c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
    const std::string second = try_cuda_backward();
    if (!second.empty()) throw std::runtime_error("a backward on CUDA fails in torch's autograd engine: " + second);
    return true;
  }();
  (void)checked;
}

}  // namespace

// The caching allocator's allocated bytes of one device (the aggregate pool): the profiler's meter and the
// workspaces' measurement read the same statistic.
static c10::CachingAllocator::Stat allocated_stat(c10::DeviceIndex device) {
  constexpr auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[aggregate];
}

namespace {

std::int64_t allocated_now() { return allocated_stat(c10::cuda::current_device()).current; }

std::int64_t measure_library_workspaces() {
  c10::cuda::device_synchronize();
  const std::int64_t before = allocated_now();
  {
    torch::NoGradGuard no_grad;
    for (const torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
      const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
      const torch::Tensor a = torch::ones({64, 64}, o), bias = torch::ones({64}, o);
      (void)torch::mm(a, a);
      (void)torch::addmm(bias, a, a);
      (void)torch::nn::functional::linear(a, a, bias);
    }
    c10::cuda::device_synchronize();
  }
  return std::max<std::int64_t>(0, allocated_now() - before);
}

std::atomic<std::int64_t> library_workspace_bytes{0};

}  // namespace

std::int64_t cuda_library_workspace_bytes() { return library_workspace_bytes.load(); }

void cuda_init() {
  // Both once per process; harmless where they were not needed.
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  torch::autograd::Engine::get_base_engine().initialize_device_threads_pool();
  torch::autograd::Engine::get_default_engine().initialize_device_threads_pool();
  // Backward on the calling thread on CUDA always: one device per process, so the engine's device thread
  // would only hand the work over; the check above names what the engine holds when its queues fail.
  check_cuda_backward();
  c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
  static std::once_flag measured;
  std::call_once(measured, [] { library_workspace_bytes = measure_library_workspaces(); });
}

}  // namespace zeroplan

namespace zeroplan::detail {

namespace {

class CudaMemoryMeter final : public MemoryMeter {
 public:
  explicit CudaMemoryMeter(int device) : device_(static_cast<c10::DeviceIndex>(device)) {}
  std::int64_t begin_phase() override {
    c10::cuda::device_synchronize();
    c10::cuda::CUDACachingAllocator::resetPeakStats(device_);
    return live();
  }
  std::int64_t live() const override { return stat().current; }
  std::int64_t peak() const override { return stat().peak; }
  std::int64_t library_bytes() const override { return cuda_library_workspace_bytes(); }

 private:
  c10::CachingAllocator::Stat stat() const { return zeroplan::allocated_stat(device_); }
  c10::DeviceIndex device_;
};

class CudaEventTimer final : public PhaseTimer {
 public:
  void start() override {
    start_ = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);
    stop_ = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);
    start_->record(at::cuda::getCurrentCUDAStream());
  }
  double stop_s() override {
    stop_->record(at::cuda::getCurrentCUDAStream());
    stop_->synchronize();
    return static_cast<double>(start_->elapsed_time(*stop_)) / 1e3;
  }

 private:
  std::unique_ptr<at::cuda::CUDAEvent> start_;
  std::unique_ptr<at::cuda::CUDAEvent> stop_;
};

}  // namespace

std::unique_ptr<MemoryMeter> make_cuda_memory_meter(int device_index) {
  cuda_init();
  return std::make_unique<CudaMemoryMeter>(device_index);
}

std::unique_ptr<PhaseTimer> make_cuda_event_timer() { return std::make_unique<CudaEventTimer>(); }

std::string cuda_device_name(int device_index) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device_index));
  return prop != nullptr ? std::string(prop->name) : "cuda:" + std::to_string(device_index);
}

void cuda_synchronize() { c10::cuda::device_synchronize(); }

#if ZEROPLAN_HAVE_CUPTI
namespace {

// CUPTI activity buffers: CUPTI asks for a buffer, fills it with records, and hands it back completed;
// the kernel durations are summed into a process-wide counter.
constexpr std::size_t kBufferBytes = 8u << 20;
static_assert(offsetof(CUpti_ActivityKernel4, start) == offsetof(CUpti_ActivityKernel10, start) &&
                  offsetof(CUpti_ActivityKernel4, end) == offsetof(CUpti_ActivityKernel10, end),
              "CUPTI kernel records moved start/end");
constexpr std::size_t kAlign = 8;
std::atomic<std::uint64_t> g_kernel_ns{0};

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext /*ctx*/, uint32_t /*stream*/, uint8_t* buffer, size_t /*size*/,
                               size_t valid_size) {
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
        record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      // Every kernel record version (CUpti_ActivityKernel4 in CUDA 9 to Kernel11 in CUPTI 13.2) has start
      // and end at the same place; Kernel4 is declared by every CUPTI zeroplan builds against (the wheels'
      // 13.0 and 13.2 differ in their newest), so the read does not depend on which one this is.
      const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel4*>(record);
      g_kernel_ns.fetch_add(kernel->end - kernel->start);
    }
  }
  std::free(buffer);
}

void check_cupti(CUptiResult result, const char* what) {
  if (result != CUPTI_SUCCESS) {
    const char* message = nullptr;
    cuptiGetResultString(result, &message);
    TORCH_CHECK(false, "CUPTI ", what, " failed: ", message != nullptr ? message : "unknown error");
  }
}

std::mutex g_cupti_mutex;

// RAII: concurrent-kernel activity recording is on while one of these lives.
class CuptiKernelTimer final : public PhaseTimer {
 public:
  CuptiKernelTimer() : lock_(g_cupti_mutex) {
    check_cupti(cuptiActivityRegisterCallbacks(&buffer_requested, &buffer_completed),
                "cuptiActivityRegisterCallbacks");
    check_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  }
  ~CuptiKernelTimer() override {
    cuptiActivityFlushAll(1);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  }
  CuptiKernelTimer(const CuptiKernelTimer&) = delete;
  CuptiKernelTimer& operator=(const CuptiKernelTimer&) = delete;

  void start() override {
    c10::cuda::device_synchronize();
    cuptiActivityFlushAll(1);
    g_kernel_ns.store(0);
  }
  double stop_s() override {
    c10::cuda::device_synchronize();
    check_cupti(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
    return static_cast<double>(g_kernel_ns.load()) * 1e-9;
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace

std::unique_ptr<PhaseTimer> make_cupti_kernel_timer() { return std::make_unique<CuptiKernelTimer>(); }
#endif  // ZEROPLAN_HAVE_CUPTI

}  // namespace zeroplan::detail

#endif  // ZEROPLAN_HAVE_CUDA
