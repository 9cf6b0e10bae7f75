// The CUDA side of the profiler: caching-allocator statistics, CUDA-event timing, CUPTI kernel time.
// Compiled only with ZEROPLAN_HAVE_CUDA (and the CUPTI part with ZEROPLAN_HAVE_CUPTI).
#include "device.h"

#if ZEROPLAN_HAVE_CUDA

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/autograd/engine.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <mutex>

#if ZEROPLAN_HAVE_CUPTI
#include <cupti.h>
#endif

namespace zeroplan::detail {

namespace {

constexpr auto kAggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);

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

 private:
  c10::CachingAllocator::Stat stat() const {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device_).allocated_bytes[kAggregate];
  }
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

void cuda_init() {
  // torch.cuda.init(), as Python does (is_pinned() answers false before it), and the autograd engines'
  // per-device threads started now that CUDA is up: on the lent H100 with torch 2.11 every backward of a
  // C++ process failed with "device.index() < device_ready_queues_.size()", the engine holding no CUDA
  // queue (README, the GPU kit). Both calls happen once per process; harmless where they were not needed.
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  torch::autograd::Engine::get_base_engine().initialize_device_threads_pool();
  torch::autograd::Engine::get_default_engine().initialize_device_threads_pool();
}

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
