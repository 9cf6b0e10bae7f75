// Private to the profiler (profiler.cpp drives; the other files of this folder are its parts): the
// devices a profile measures on (devices.cpp), the memory pass of one unit (measure.cpp), the timing
// rounds of whole training steps with the run's concurrent ranks (timing.cpp), the statistics and fits
// (stats.cpp), and the profile's trace (here).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "device.h"
#include "zeroplan/profiles/counting_allocator.h"
#include "zeroplan/profiles/profiler.h"
#include "zeroplan/profiles/trace.h"
#include "zeroplan/profiles/zoo.h"

namespace zeroplan::detail {

// The profile's Chrome trace (profile_model with a TraceWriter): on pid 0, a span per measured
// forward and backward (tid 0: the timed rounds; tid 1: the memory pass) and the memory meter's live
// and peak bytes at each one's start and end ("memory device"). Timestamps are the host's steady clock
// since the profile began; durations the profiler's own measurements.
class ProfilerTrace {
 public:
  static constexpr int kTimedTid = 0;
  static constexpr int kMemoryTid = 1;

  explicit ProfilerTrace(TraceWriter& w) : w_(w), origin_(std::chrono::steady_clock::now()) {
    w_.process_name(0, "zeroplan profile");
    w_.thread_name(0, kTimedTid, "compute");
    w_.thread_sort_index(0, kTimedTid, kTimedTid);
    w_.thread_name(0, kMemoryTid, "memory pass");
    w_.thread_sort_index(0, kMemoryTid, kMemoryTid);
  }
  // Start of a phase (us): now, but not before the end of the last one (the phases run one at a time).
  double begin_us() const {
    const double now = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
    return std::max(now, last_end_us_);
  }
  void phase(int tid, const std::string& name, double ts_us, double dur_s, TraceArgs args, std::int64_t live_before,
             std::int64_t live_after, std::int64_t peak) {
    const double dur_us = std::max(0.0, dur_s) * 1e6;
    w_.span(name, "compute", ts_us, dur_us, 0, tid, std::move(args));
    w_.counter("memory device", ts_us, 0, {{"bytes", live_before}, {"peak_bytes", live_before}});
    w_.counter("memory device", ts_us + dur_us, 0, {{"bytes", live_after}, {"peak_bytes", std::max(peak, live_after)}});
    last_end_us_ = ts_us + dur_us;
  }

 private:
  TraceWriter& w_;
  std::chrono::steady_clock::time_point origin_;
  double last_end_us_ = 0;
};

// What a traced phase is: its unit, batch and repeat (-1 for the memory pass).
struct TracedPhase {
  const std::string& unit_name;
  int unit;
  int batch;
  int repeat;
  TraceArgs args(const char* phase) const {
    TraceArgs a{{"unit", unit}, {"unit_name", unit_name}, {"batch", batch}, {"phase", phase}};
    if (repeat >= 0) a.emplace_back("repeat", repeat);
    return a;
  }
};

struct Devices {
  MemoryMeter& memory;
  PhaseTimer& timer;
  std::function<void()> synchronize;
  PhaseTimer* kernel_timer = nullptr;  // CUPTI: summed kernel time; null when not available
  ProfilerTrace* trace = nullptr;      // null: no trace
};

// The task's loss after the last unit, as a training step runs it: the loss of the detached output
// and its gradient, which then feeds the unit's backward. Empty for every other unit.
using LossFn = std::function<torch::Tensor(const torch::Tensor&)>;

// Device-side context for a profile: memory meter, timer, synchronisation; the CPU allocator is
// installed for the lifetime of this object.
class DeviceContext {
 public:
  explicit DeviceContext(const torch::Device& device);
  Devices devices() { return Devices{*memory_, *timer_, synchronize_, kernel_timer_.get()}; }

 private:
  std::optional<ScopedCpuAllocator> scoped_;
  std::unique_ptr<MemoryMeter> memory_;
  std::unique_ptr<PhaseTimer> timer_;
  std::function<void()> synchronize_;
  std::unique_ptr<PhaseTimer> kernel_timer_;
};

// ---- devices.cpp ----
torch::Dtype parse_dtype(const std::string& dtype);
torch::Device parse_device(const std::string& device);
std::vector<std::int64_t> shape_of(const torch::Tensor& t);
double tensor_bytes(const torch::Tensor& t);
void reset_grads(const std::vector<torch::Tensor>& params);
void validate_options(const ProfileOptions& o);
void move_module(torch::nn::Module& module, const torch::Device& device, torch::Dtype dtype);

// ---- measure.cpp: the memory pass ----
// Measures `unit` on `input`; returns the measurement and the (detached) output for the next unit.
// `grad_params`: every parameter whose gradient the unit's backward may write (own and borrowed).
// With `loss` (the last unit), the forward figures include the loss and its gradient: its time, its
// temporaries in the forward peak, and the output's gradient, held until the unit's backward, in the
// saved bytes; the backward starts from that gradient.
std::pair<UnitMeasurement, torch::Tensor> measure(zoo::UnitModule& unit, const torch::Tensor& input,
                                                  const std::vector<torch::Tensor>& grad_params,
                                                  const ProfileOptions& options, Devices& dev,
                                                  const LossFn& loss = {}, bool time_it = true,
                                                  const TracedPhase* traced = nullptr, bool input_grad = true);

// ---- timing.cpp: the timing rounds ----
// A thread that stands for a rank: `threads` intra-op threads (0: torch's default).
void init_rank_thread(int threads);
// One zeroed gradient accumulation buffer per parameter (the executor's flat gradient, per tensor).
std::vector<torch::Tensor> zeroed_like(const std::vector<torch::Tensor>& params);

// The run's other local ranks: `n` threads, each running one training step (`work` for the index
// step() names) per step of the measured rank, all of them starting together (a std::barrier), as a
// run's ranks leave each step's collectives together and compute the same units at the same time. Each
// has `threads` intra-op threads. Between steps they block at the barrier (no spinning).
class ConcurrentRanks {
 public:
  using Work = std::function<void(int index, std::vector<torch::Tensor>& accum)>;
  ConcurrentRanks(int n, int threads, Work work, const std::vector<torch::Tensor>& params)
      : work_(std::move(work)), sync_(n + 1) {
    for (int i = 0; i < n; ++i) {
      workers_.emplace_back([this, threads, &params] {
        init_rank_thread(threads);
        std::vector<torch::Tensor> accum = zeroed_like(params);
        bool failed = false;  // after an error the worker keeps meeting the others, idle
        for (std::size_t phase = 0;; ++phase) {
          sync_.arrive_and_wait();
          const int k = command_[phase % 2].load();
          if (k < 0) return;
          if (failed) continue;
          try {
            work_(k, accum);
          } catch (const std::exception& e) {
            std::lock_guard<std::mutex> lock(error_mutex_);
            if (error_.empty()) error_ = e.what();
            failed = true;
          }
        }
      });
    }
  }
  ~ConcurrentRanks() {
    command(-1);  // stop
    for (auto& w : workers_) w.join();
  }
  ConcurrentRanks(const ConcurrentRanks&) = delete;
  ConcurrentRanks& operator=(const ConcurrentRanks&) = delete;
  // Starts the others' step at `index` together with the caller's own, which follows this call.
  void step(int index) { command(index); }
  // The first error a worker stopped on ("" when none).
  std::string error() {
    std::lock_guard<std::mutex> lock(error_mutex_);
    return error_;
  }

 private:
  Work work_;
  std::barrier<> sync_;
  std::mutex error_mutex_;
  std::string error_;
  // What the workers do after barrier phase p: command_[p % 2] (a step's index, -1: stop). Two slots:
  // the caller writes phase p + 1's before it arrives there, while a worker may still be reading phase
  // p's; it cannot write p's slot again before every worker has arrived at p + 1, after its read.
  void command(int index) {
    command_[phase_ % 2].store(index);
    ++phase_;
    sync_.arrive_and_wait();
  }
  std::atomic<int> command_[2] = {0, 0};
  std::size_t phase_ = 0;
  std::vector<std::thread> workers_;
};

// One training step's compute at one batch, as the executor runs it: the forward of every unit in order
// on the previous unit's detached output (the last with the loss and its gradient), then the backward of
// every unit in reverse from its output's gradient, each parameter's gradient added into `accum`. A
// unit's backward so finds its activations as a step leaves them (the rest of the model ran in between,
// the caches hold something else), and the units run in the order the run interleaves them with a
// concurrent rank's. With `fwd` and `bwd` (one entry per unit), each phase is timed into them (and
// traced with dev.trace), and `loss_s` gets the loss's part of the last unit's forward; without,
// nothing is timed (a concurrent rank's step).
void step_pass(std::vector<zoo::Unit>& units, const torch::Tensor& input, const LossFn& loss,
               const std::vector<torch::Tensor>& params, std::vector<torch::Tensor>& accum, Devices* dev, int batch,
               int repeat, double* fwd, double* bwd, double* loss_s = nullptr);

// How far `ranks` ranks drift apart over one training step's compute started together: `rounds` times,
// every rank (the calling thread and ranks - 1 others, `threads` intra-op threads each) waits at a
// barrier, then runs step_pass; each round gives (slowest - mean) / mean of their durations. Returns
// the mean over the rounds: the fraction of a step by which the last rank to reach a collective trails.
double lock_step_skew(std::vector<zoo::Unit>& units, const torch::Tensor& input, const LossFn& loss,
                      const std::vector<torch::Tensor>& params, int ranks, int threads, int rounds);

}  // namespace zeroplan::detail
