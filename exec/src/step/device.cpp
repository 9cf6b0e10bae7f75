#include "zeroplan/exec/device.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "zeroplan/config.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/profiles/counting_allocator.h"
#include "zeroplan/profiles/cuda_init.h"
#include "zeroplan/profiles/host_allocator.h"

#if ZEROPLAN_HAVE_CUDA
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace zeroplan::exec {

// ---- HostPool ----

HostPool::HostPool(AllocFn alloc, FreeFn free) : alloc_(alloc), free_(free) {}
HostPool::HostPool(c10::Allocator* pow2_caching) : caching_(pow2_caching) {}

void HostPool::on_alloc(std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  live_ += bytes;
  peak_ = std::max(peak_, live_);
  if (caching_ == nullptr) {
    reserved_ = std::max(reserved_, live_);
    return;
  }
  const auto k = static_cast<std::size_t>(pinned_block_class(std::max<std::int64_t>(bytes, 1)));
  if (++live_blocks_[k] > most_blocks_[k]) {
    most_blocks_[k] += 1;
    reserved_ += std::int64_t{1} << k;
  }
}

void HostPool::on_free(std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  live_ -= bytes;
  if (caching_ != nullptr) live_blocks_[static_cast<std::size_t>(pinned_block_class(std::max<std::int64_t>(bytes, 1)))] -= 1;
}

torch::Tensor HostPool::empty(std::int64_t numel, torch::ScalarType dtype) {
  const std::int64_t bytes = numel * static_cast<std::int64_t>(c10::elementSize(dtype));
  const auto options = torch::TensorOptions().dtype(dtype);
  if (caching_ != nullptr) {
    // The block is handed back to the cache when the tensor dies. Every copy into or out of it was
    // waited for by then (Device::wait_copies), so no event needs recording.
    auto block = std::make_shared<c10::DataPtr>(caching_->allocate(static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1))));
    if (block->get() == nullptr) throw ExecError("host pool: cannot pin " + std::to_string(bytes) + " bytes");
    on_alloc(bytes);
    auto deleter = [this, block, bytes](void*) {
      block->clear();
      on_free(bytes);
    };
    return torch::from_blob(block->get(), {numel}, deleter, options);
  }
  void* ptr = alloc_(static_cast<std::size_t>(std::max<std::int64_t>(bytes, 64)));
  if (ptr == nullptr) throw ExecError("host pool: cannot allocate " + std::to_string(bytes) + " bytes");
  on_alloc(bytes);
  FreeFn free_fn = free_;
  auto deleter = [this, free_fn, bytes](void* p) {
    free_fn(p);
    on_free(bytes);
  };
  return torch::from_blob(ptr, {numel}, deleter, options);
}

torch::Tensor HostPool::zeros(std::int64_t numel, torch::ScalarType dtype) {
  torch::Tensor t = empty(numel, dtype);
  t.zero_();
  return t;
}

std::int64_t HostPool::live_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}
std::int64_t HostPool::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}
std::int64_t HostPool::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_;
}
void HostPool::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_ = live_;
}

namespace {

void* aligned_host_alloc(std::size_t bytes) { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
void aligned_host_free(void* p) { std::free(p); }

torch::Tensor cpu_rng_state() {
  const at::Generator& gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(const_cast<at::Generator&>(gen).mutex());
  return gen.get_state();
}
void set_cpu_rng_state(const torch::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// What every side lane copies: contiguous tensors of one byte size.
void check_side_copy(const torch::Tensor& dst, const torch::Tensor& src) {
  if (!dst.is_contiguous() || !src.is_contiguous() || dst.nbytes() != src.nbytes())
    throw ExecError("side lane: copies contiguous tensors of one size (" + std::to_string(dst.nbytes()) + " <- " +
                    std::to_string(src.nbytes()) + " bytes)");
}

// The CPU side lane: one thread, jobs in a queue; finished jobs are dropped by wait() on the caller.
class CpuSideLane final : public SideLane {
 public:
  CpuSideLane() : worker_([this] { run(); }) {}
  ~CpuSideLane() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  std::uint64_t submit(const torch::Tensor& dst, const torch::Tensor& src, CopyDirection dir) override {
    check_side_copy(dst, src);
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back({dst, src, ++submitted_, dir});
    cv_.notify_all();
    return submitted_;
  }
  void wait(std::uint64_t ticket) override {
    std::deque<Job> finished;  // dropped outside the lock
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [&] { return done_ >= ticket; });
      while (!jobs_.empty() && jobs_.front().ticket <= done_) {
        finished.push_back(std::move(jobs_.front()));
        jobs_.pop_front();
      }
    }
  }
  SideLaneSeconds busy_s() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return busy_s_;
  }

 private:
  struct Job {
    torch::Tensor dst, src;
    std::uint64_t ticket = 0;
    CopyDirection dir = CopyDirection::d2h;
  };
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || started_ < submitted_; });
      if (started_ == submitted_) return;  // stopping with nothing left
      const Job& job = jobs_[static_cast<std::size_t>(started_ + 1 - jobs_.front().ticket)];
      ++started_;
      void* dst = job.dst.data_ptr();
      const void* src = job.src.data_ptr();
      const std::size_t n = job.dst.nbytes();
      const CopyDirection dir = job.dir;
      lock.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(dst, src, n);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      lock.lock();
      busy_s_[dir] += dt;
      done_ = started_;
      done_cv_.notify_all();
    }
  }
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<Job> jobs_;  // tickets done_+1 .. submitted_ and finished ones not yet dropped
  std::uint64_t submitted_ = 0, started_ = 0, done_ = 0;
  SideLaneSeconds busy_s_;
  bool stop_ = false;
  std::thread worker_;  // last: starts once the members above exist
};

// CPU: the device pool is every tensor ATen allocates (counting allocator, installed for the
// device's lifetime); the host pool is aligned malloc outside it. Copies are synchronous.
class CpuDevice final : public Device {
 public:
  CpuDevice() : host_(aligned_host_alloc, aligned_host_free) {}
  std::string name() const override { return "cpu"; }
  torch::Device torch_device() const override { return torch::kCPU; }
  void synchronize() override {}
  void wait_compute() override {}
  std::int64_t live_bytes() const override { return scope_.allocator().live_bytes(); }
  std::int64_t peak_bytes() const override { return scope_.allocator().peak_bytes(); }
  void reset_peak() override { scope_.allocator().reset_peak(); }
  void set_limit(std::int64_t bytes) override { scope_.allocator().set_limit(bytes > 0 ? bytes : -1); }
  std::int64_t limit() const override { return std::max<std::int64_t>(scope_.allocator().limit(), 0); }
  bool is_out_of_memory(const std::exception& e, DeviceRefusal* out) const override {
    const auto* oom = dynamic_cast<const zeroplan::OutOfMemoryError*>(&e);
    if (oom == nullptr) return false;
    out->need_bytes = oom->need_bytes();
    out->limit_bytes = oom->limit_bytes();
    return true;
  }
  HostPool& host_pool() override { return host_; }
  void copy_d2h(const torch::Tensor& dst, const torch::Tensor& src) override { dst.copy_(src); }
  void copy_h2d(const torch::Tensor& dst, const torch::Tensor& src) override { dst.copy_(src); }
  void wait_copies() override {}
  SideLane& side_lane() override { return lane_; }
  torch::Tensor rng_state() override { return cpu_rng_state(); }
  void set_rng_state(const torch::Tensor& state) override { set_cpu_rng_state(state); }

 private:
  ScopedCpuAllocator scope_;
  HostPool host_;
  CpuSideLane lane_;
};

#if ZEROPLAN_HAVE_CUDA
// The CUDA side lane: a stream from the pool; each copy waits for an event recorded on the compute
// stream at submit, and records its own. wait() waits for it here, on the calling thread, as the CPU
// lane's does, and drops the finished jobs: the lane then holds no tensor of a copy that was waited for,
// so device memory its caller lets go of is free at once. (Making the compute stream wait on the event
// instead let the thread run ahead of the copies while the lane held every tensor still in flight: on an
// H100, ResNet-50 at batch 256 with all activations offloaded held 10.3 GiB where 4.7 were predicted.)
class CudaSideLane final : public SideLane {
 public:
  explicit CudaSideLane(c10::DeviceIndex index) : index_(index), stream_(c10::cuda::getStreamFromPool(false, index)) {}
  ~CudaSideLane() override { stream_.synchronize(); }
  std::uint64_t submit(const torch::Tensor& dst, const torch::Tensor& src, CopyDirection dir) override {
    check_side_copy(dst, src);
    drop_finished();
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(index_));
    ready.block(stream_);
    Job job{dst, src, ++submitted_, dir, std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault),
            std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault)};
    {
      c10::cuda::CUDAStreamGuard guard(stream_);
      job.start->record(stream_);
      job.dst.copy_(job.src, /*non_blocking=*/true);
      job.done->record(stream_);
    }
    jobs_.push_back(std::move(job));
    return submitted_;
  }
  void wait(std::uint64_t ticket) override {
    for (Job& j : jobs_) {
      if (j.ticket > ticket) break;
      j.done->synchronize();
    }
    drop_finished();
  }
  SideLaneSeconds busy_s() const override {
    const_cast<CudaSideLane*>(this)->drop_finished();
    return busy_s_;
  }

 private:
  struct Job {
    torch::Tensor dst, src;
    std::uint64_t ticket = 0;
    CopyDirection dir = CopyDirection::d2h;
    std::unique_ptr<at::cuda::CUDAEvent> start, done;
  };
  void drop_finished() {
    while (!jobs_.empty() && jobs_.front().done->query()) {
      busy_s_[jobs_.front().dir] += jobs_.front().start->elapsed_time(*jobs_.front().done) * 1e-3;
      jobs_.pop_front();
    }
  }
  c10::DeviceIndex index_;
  c10::cuda::CUDAStream stream_;
  std::deque<Job> jobs_;
  std::uint64_t submitted_ = 0;
  SideLaneSeconds busy_s_;
};

// CUDA: the caching allocator's statistics; the limit is a memory fraction; the host pool is pinned
// memory from PyTorch's caching host allocator, as DeepSpeed's and FSDP's offload buffers are
// (zeroplan/profiles/host_allocator.h).
// Copies are queued on the current stream with non_blocking (ordered with compute).
class CudaDevice final : public Device {
 public:
  explicit CudaDevice(c10::DeviceIndex index) : index_(index), host_(at::getHostAllocator(at::kCUDA)) {
    // What `torch.cuda.init()` does in Python, which a C++ program must ask for (cuda_init.h says why).
    zeroplan::cuda_init();
    c10::cuda::set_device(index_);
  }
  std::string name() const override { return "cuda:" + std::to_string(index_); }
  torch::Device torch_device() const override { return torch::Device(torch::kCUDA, index_); }
  void synchronize() override { c10::cuda::device_synchronize(); }
  void wait_compute() override { c10::cuda::getCurrentCUDAStream(index_).synchronize(); }
  std::int64_t live_bytes() const override { return stat().current; }
  std::int64_t peak_bytes() const override { return stat().peak; }
  void reset_peak() override { c10::cuda::CUDACachingAllocator::resetPeakStats(index_); }
  void set_limit(std::int64_t bytes) override {
    std::size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    limit_ = bytes;
    c10::cuda::CUDACachingAllocator::setMemoryFraction(
        bytes > 0 ? std::min(1.0, static_cast<double>(bytes) / static_cast<double>(total_b)) : 1.0, index_);
  }
  std::int64_t limit() const override { return limit_; }
  bool is_out_of_memory(const std::exception& e, DeviceRefusal* out) const override {
    if (dynamic_cast<const c10::OutOfMemoryError*>(&e) == nullptr) return false;
    out->need_bytes = 0;  // the caching allocator's message has the details
    out->limit_bytes = limit_;
    return true;
  }
  HostPool& host_pool() override { return host_; }
  void copy_d2h(const torch::Tensor& dst, const torch::Tensor& src) override { dst.copy_(src, true); }
  void copy_h2d(const torch::Tensor& dst, const torch::Tensor& src) override { dst.copy_(src, true); }
  void wait_copies() override { synchronize(); }
  SideLane& side_lane() override {
    if (!lane_) lane_ = std::make_unique<CudaSideLane>(index_);
    return *lane_;
  }
  torch::Tensor rng_state() override {
    // CPU and CUDA states side by side.
    const at::Generator& g = at::cuda::detail::getDefaultCUDAGenerator(index_);
    torch::Tensor cuda_state;
    {
      std::lock_guard<std::mutex> lock(const_cast<at::Generator&>(g).mutex());
      cuda_state = g.get_state();
    }
    return torch::cat({cpu_rng_state().view(-1), cuda_state.view(-1)});
  }
  void set_rng_state(const torch::Tensor& state) override {
    const std::int64_t cpu_n = cpu_rng_state().numel();
    set_cpu_rng_state(state.narrow(0, 0, cpu_n).clone());
    at::Generator g = at::cuda::detail::getDefaultCUDAGenerator(index_);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(state.narrow(0, cpu_n, state.numel() - cpu_n).clone());
  }

 private:
  c10::CachingAllocator::Stat stat() const {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index_);
    return stats.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  }
  c10::DeviceIndex index_;
  std::int64_t limit_ = 0;
  HostPool host_;
  std::unique_ptr<CudaSideLane> lane_;
};
#endif

}  // namespace

std::unique_ptr<Device> make_device(const std::string& name) {
  if (name == "cpu") return std::make_unique<CpuDevice>();
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
#if ZEROPLAN_HAVE_CUDA
    const int index = name == "cuda" ? 0 : std::atoi(name.c_str() + 5);
    if (!torch::cuda::is_available() || index >= static_cast<int>(torch::cuda::device_count())) {
      throw ExecError("device " + name + ": no such CUDA device on this machine (" +
                      std::to_string(torch::cuda::device_count()) + " visible)");
    }
    return std::make_unique<CudaDevice>(static_cast<c10::DeviceIndex>(index));
#else
    throw ExecError("device " + name + ": this build has no CUDA (configure with -DZEROPLAN_WITH_CUDA=ON)");
#endif
  }
  throw ExecError("unknown device '" + name + "' (cpu, cuda, cuda:<i>)");
}

}  // namespace zeroplan::exec
