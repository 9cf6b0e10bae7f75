// The per-unit profiler (see profiler.h for what each figure means).
#include "zeroplan/profiles/profiler.h"

#include <torch/torch.h>
#include <torch/version.h>
#include <zeroplan/config.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <mutex>
#include <thread>

#include "device.h"
#include "zeroplan/profiles/counting_allocator.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/flops.h"
#include "zeroplan/profiles/host_heap.h"
#include "zeroplan/profiles/saved_tensors.h"
#include "zeroplan/profiles/trace.h"
#include "zeroplan/profiles/zoo.h"

namespace zeroplan {

// ---- timers and statistics ----

std::unique_ptr<PhaseTimer> make_phase_timer(const std::string& device) {
  if (device == "cpu") return std::make_unique<WallTimer>();
  if (device.rfind("cuda", 0) == 0) {
#if ZEROPLAN_HAVE_CUDA
    return detail::make_cuda_event_timer();
#else
    throw SchemaError("device '" + device + "': this build of zeroplan has no CUDA");
#endif
  }
  throw SchemaError("device '" + device + "': expected cpu, cuda or cuda:N");
}

namespace {
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}
}  // namespace

TimingStats timing_stats(std::vector<double> samples_s) {
  std::sort(samples_s.begin(), samples_s.end());
  const std::size_t n = samples_s.size(), cut = n / 10;
  double sum = 0;
  for (std::size_t i = cut; i + cut < n; ++i) sum += samples_s[i];
  const double trimmed = n > 2 * cut ? sum / static_cast<double>(n - 2 * cut) : 0.0;
  return TimingStats{quantile(samples_s, 0.5), quantile(samples_s, 0.1), quantile(samples_s, 0.9), trimmed};
}

Fit fit_linear(const std::vector<double>& batches, const std::vector<double>& values) {
  TORCH_INTERNAL_ASSERT(batches.size() == values.size() && !batches.empty());
  const auto n = static_cast<double>(batches.size());
  if (batches.size() == 1) {
    return Fit{0, batches[0] != 0 ? values[0] / batches[0] : 0, 1, 1};
  }
  const double mx = std::accumulate(batches.begin(), batches.end(), 0.0) / n;
  const double my = std::accumulate(values.begin(), values.end(), 0.0) / n;
  double sxx = 0, sxy = 0, syy = 0;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    sxx += (batches[i] - mx) * (batches[i] - mx);
    sxy += (batches[i] - mx) * (values[i] - my);
    syy += (values[i] - my) * (values[i] - my);
  }
  Fit fit;
  fit.points = static_cast<int>(batches.size());
  fit.per_sample = sxx > 0 ? sxy / sxx : 0;
  fit.intercept = my - fit.per_sample * mx;
  double ss_res = 0;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const double r = values[i] - fit.at(batches[i]);
    ss_res += r * r;
  }
  // Exactly linear (or constant) values fit perfectly; guard the 0/0 and rounding noise.
  fit.r2 = (syy <= 1e-24 * std::max(1.0, my * my)) ? 1.0 : std::clamp(1.0 - ss_res / syy, -1e300, 1.0);
  return fit;
}

// ---- measuring one unit ----

namespace {

class CpuMemoryMeter final : public detail::MemoryMeter {
 public:
  explicit CpuMemoryMeter(CountingAllocator& a) : a_(a) {}
  std::int64_t begin_phase() override { return a_.reset_peak(); }
  std::int64_t live() const override { return a_.live_bytes(); }
  std::int64_t peak() const override { return a_.peak_bytes(); }

 private:
  CountingAllocator& a_;
};

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
  detail::MemoryMeter& memory;
  PhaseTimer& timer;
  std::function<void()> synchronize;
  PhaseTimer* kernel_timer = nullptr;  // CUPTI: summed kernel time; null when not available
  ProfilerTrace* trace = nullptr;      // null: no trace
};

// The task's loss after the last unit, as a training step runs it: the loss of the detached output
// and its gradient, which then feeds the unit's backward. Empty for every other unit.
using LossFn = std::function<torch::Tensor(const torch::Tensor&)>;

// The executor's backward of one unit (pieces::differentiate in exec/src/step): the gradients of the
// input (when it needs one) and of `params` returned by autograd, each parameter's added into `accum`.
// Returns the input's gradient (undefined when the input needs none).
torch::Tensor accumulate_backward(const torch::Tensor& y, const torch::Tensor& g, const torch::Tensor& x,
                                  const std::vector<torch::Tensor>& params, std::vector<torch::Tensor>& accum) {
  std::vector<torch::Tensor> inputs;
  const bool input_grad = x.requires_grad();
  if (input_grad) inputs.push_back(x);
  inputs.insert(inputs.end(), params.begin(), params.end());
  const auto grads = torch::autograd::grad({y}, inputs, {g}, /*retain_graph=*/false, /*create_graph=*/false,
                                           /*allow_unused=*/true);
  torch::NoGradGuard no_grad;
  for (std::size_t k = 0; k < params.size(); ++k) {
    const torch::Tensor& gk = grads[k + (input_grad ? 1 : 0)];
    if (gk.defined()) accum[k].add_(gk.reshape(accum[k].sizes()));
  }
  return input_grad ? grads[0] : torch::Tensor();
}

// A thread that stands for a rank: `threads` intra-op threads (0: torch's default).
void init_rank_thread(int threads) {
  if (threads > 0) {
    at::set_num_threads(threads);
  } else {
    at::init_num_threads();
  }
}

// One zeroed gradient accumulation buffer per parameter (the executor's flat gradient, per tensor).
std::vector<torch::Tensor> zeroed_like(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  out.reserve(params.size());
  for (const auto& p : params) out.push_back(torch::zeros_like(p));
  return out;
}

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
               int repeat, double* fwd, double* bwd, double* loss_s = nullptr) {
  const std::size_t nu = units.size();
  ProfilerTrace* trace = dev != nullptr ? dev->trace : nullptr;
  double ts_us = 0;
  std::int64_t live0 = 0;
  auto begin = [&] {
    if (dev == nullptr) return;
    if (trace != nullptr) {
      live0 = dev->memory.begin_phase();
      ts_us = trace->begin_us();
    }
    dev->timer.start();
  };
  auto end = [&](double* out, std::size_t i, const char* phase, double earlier_s = 0) {
    if (dev == nullptr) return;
    out[i] = dev->timer.stop_s() + earlier_s;
    if (trace != nullptr) {
      const TracedPhase traced{units[i].name, static_cast<int>(i), batch, repeat};
      trace->phase(ProfilerTrace::kTimedTid, std::string(phase) + " " + units[i].name, ts_us, out[i],
                   traced.args(phase), live0, dev->memory.live(), dev->memory.peak());
    }
  };
  std::vector<torch::Tensor> xs(nu), ys(nu);
  torch::Tensor x = input, g;
  for (std::size_t i = 0; i < nu; ++i) {
    xs[i] = x.detach();
    // The model's input never needs a gradient (the executor differentiates only later units' inputs).
    if (xs[i].is_floating_point() && i > 0) xs[i].requires_grad_(true);
    begin();
    ys[i] = units[i].module->forward(xs[i]);
    double earlier_s = 0;  // the last unit: its own forward and its loss, timed apart and summed
    if (i + 1 == nu && loss && ys[i].requires_grad()) {
      if (dev != nullptr) {
        earlier_s = dev->timer.stop_s();
        dev->timer.start();
      }
      torch::Tensor z = ys[i].detach().requires_grad_(true);
      g = torch::autograd::grad({loss(z)}, {z})[0];
      if (dev != nullptr) {
        const double l = dev->timer.stop_s();
        if (loss_s != nullptr) *loss_s = l;
        earlier_s += l;
        dev->timer.start();
      }
    }
    end(fwd, i, "forward", earlier_s);
    x = ys[i];
  }
  x = torch::Tensor();
  for (std::size_t k = nu; k-- > 0;) {
    if (!g.defined()) g = torch::ones_like(ys[k]);
    begin();
    torch::Tensor g_in;
    if (ys[k].requires_grad()) g_in = accumulate_backward(ys[k], g, xs[k], params, accum);
    end(bwd, k, "backward");
    ys[k] = torch::Tensor();
    xs[k] = torch::Tensor();
    g = g_in;
  }
}

// How far `ranks` ranks drift apart over one training step's compute started together: `rounds` times,
// every rank (the calling thread and ranks - 1 others, `threads` intra-op threads each) waits at a
// barrier, then runs step_pass; each round gives (slowest - mean) / mean of their durations. Returns
// the mean over the rounds: the fraction of a step by which the last rank to reach a collective trails.
double lock_step_skew(std::vector<zoo::Unit>& units, const torch::Tensor& input, const LossFn& loss,
                      const std::vector<torch::Tensor>& params, int ranks, int threads, int rounds) {
  std::vector<std::vector<double>> seconds(static_cast<std::size_t>(ranks), std::vector<double>(rounds, 0.0));
  std::barrier sync(ranks);
  std::mutex error_mutex;
  std::string error;
  auto rank = [&](int r) {
    std::vector<torch::Tensor> accum = zeroed_like(params);
    for (int k = 0; k < rounds; ++k) {
      sync.arrive_and_wait();
      const auto t0 = std::chrono::steady_clock::now();
      try {
        step_pass(units, input, loss, params, accum, nullptr, 0, 0, nullptr, nullptr);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (error.empty()) error = e.what();
      }
      seconds[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  };
  {
    std::vector<std::thread> others;
    for (int r = 1; r < ranks; ++r) {
      others.emplace_back([&, r] {
        init_rank_thread(threads);
        rank(r);
      });
    }
    rank(0);
    for (auto& t : others) t.join();
  }
  if (!error.empty()) throw SchemaError("profile: a concurrent rank's thread failed: " + error.substr(0, error.find('\n')));
  // The first round pays for the threads' first allocations: left out.
  double sum = 0;
  int used = 0;
  for (int k = 1; k < rounds; ++k) {
    double mx = 0, mean = 0;
    for (int r = 0; r < ranks; ++r) {
      const double s = seconds[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)];
      mx = std::max(mx, s);
      mean += s / ranks;
    }
    if (mean > 0) {
      sum += (mx - mean) / mean;
      ++used;
    }
  }
  return used > 0 ? std::min(1.0, sum / used) : 0.0;
}

// One timed forward (with the loss for the last unit) and backward of `unit` on `input`: seconds each
// (profile_unit: a unit alone, timed in isolation).
std::pair<double, double> time_once(zoo::UnitModule& unit, const torch::Tensor& input,
                                    const std::vector<torch::Tensor>& grad_params, Devices& dev, const LossFn& loss,
                                    bool input_grad = true) {
  torch::Tensor x = input.detach();
  if (x.is_floating_point() && input_grad) x.requires_grad_(true);
  reset_grads(grad_params);
  dev.timer.start();
  torch::Tensor y = unit.forward(x);
  torch::Tensor g;
  if (loss && y.requires_grad()) {
    torch::Tensor z = y.detach().requires_grad_(true);
    g = torch::autograd::grad({loss(z)}, {z})[0];
  }
  const double fwd = dev.timer.stop_s();
  if (!g.defined()) g = torch::ones_like(y);
  dev.timer.start();
  if (y.requires_grad()) torch::autograd::backward({y}, {g});
  const double bwd = dev.timer.stop_s();
  reset_grads(grad_params);
  return {fwd, bwd};
}

// Measures `unit` on `input`; returns the measurement and the (detached) output for the next unit.
// `grad_params`: every parameter whose gradient the unit's backward may write (own and borrowed).
// With `loss` (the last unit), the forward figures include the loss and its gradient: its time, its
// temporaries in the forward peak, and the output's gradient, held until the unit's backward, in the
// saved bytes; the backward starts from that gradient.
std::pair<UnitMeasurement, torch::Tensor> measure(zoo::UnitModule& unit, const torch::Tensor& input,
                                                  const std::vector<torch::Tensor>& grad_params,
                                                  const ProfileOptions& options, Devices& dev,
                                                  const LossFn& loss = {}, bool time_it = true,
                                                  const TracedPhase* traced = nullptr, bool input_grad = true) {
  UnitMeasurement m;
  for (const auto& p : unit.parameters()) {
    m.params += p.numel();
    m.bytes_param += static_cast<std::int64_t>(tensor_bytes(p));
  }
  for (const auto& b : unit.buffers()) m.bytes_buffer += static_cast<std::int64_t>(tensor_bytes(b));
  m.input_shape = shape_of(input);

  torch::Tensor x = input.detach();
  if (x.is_floating_point() && input_grad) x.requires_grad_(true);
  auto clear = [&] {
    reset_grads(grad_params);
    if (x.requires_grad()) x.mutable_grad() = torch::Tensor();
  };
  auto backward = [&](const torch::Tensor& y, const torch::Tensor& g) {
    if (y.requires_grad()) torch::autograd::backward({y}, {g});
  };
  // The gradient the unit's backward starts from: the loss's (computed here, part of the forward) or
  // ones for an inner unit (allocated outside the measured phases).
  auto output_grad = [&](const torch::Tensor& y) {
    if (!loss || !y.requires_grad()) return torch::ones_like(y);
    torch::Tensor z = y.detach().requires_grad_(true);
    torch::Tensor l = loss(z);
    return torch::autograd::grad({l}, {z})[0];
  };

  // Warm-up: lazy initialisation, thread pools, allocator state.
  for (int i = 0; i < options.warmup; ++i) {
    clear();
    torch::Tensor y = unit.forward(x);
    backward(y, output_grad(y));
  }

  // Memory pass. The unit runs on a fresh copy of its input, held until the unit's backward as the
  // executor holds every unit's input (the leaf it differentiates against), so what stays live after
  // forward, minus the output, is what autograd saved plus the input, counted once whether or not
  // autograd saved it (a unit that does not save its input, e.g. an in-place ReLU on a copy, or an
  // average pool, still keeps it alive in a training step).
  clear();
  torch::Tensor x_copy = x.clone();
  const double bytes_x_copy = tensor_bytes(x_copy);
  ProfilerTrace* trace = traced != nullptr ? dev.trace : nullptr;
  // The memory pass's phases in the trace: host wall time (the phases end with a synchronize).
  auto memory_phase = [&](const char* phase, double ts_us, std::int64_t live_before) {
    if (trace == nullptr) return;
    const double dur_s = (trace->begin_us() - ts_us) * 1e-6;
    trace->phase(ProfilerTrace::kMemoryTid, std::string(phase) + " " + traced->unit_name, ts_us, dur_s,
                 traced->args(phase), live_before, dev.memory.live(), dev.memory.peak());
  };
  dev.synchronize();
  const std::int64_t live0 = dev.memory.begin_phase();
  const double fwd_ts_us = trace != nullptr ? trace->begin_us() : 0;
  // The tensors autograd saves, recorded (their storages, not held) as the forward runs; those the unit
  // alone keeps are what activation offload chooses from.
  saved_tensors::Recorder saved;
  torch::Tensor y;
  {
    saved_tensors::Scope record(saved);
    y = unit.forward(x_copy);
  }
  {
    std::vector<torch::Tensor> kept{x_copy, y};
    for (const auto& p : grad_params) kept.push_back(p);
    for (const auto& p : unit.parameters()) kept.push_back(p);
    for (const auto& b : unit.buffers()) kept.push_back(b);
    for (std::size_t i : saved_tensors::distinct_storages(saved.saved(), kept, x_copy.device().type())) m.saved_tensors.push_back(saved.saved()[i].bytes);
  }
  if (loss) {  // what a recompute of the unit (no loss) allocates
    dev.synchronize();
    m.bytes_peak_fwd_without_loss = static_cast<double>(dev.memory.peak() - live0);
  }
  torch::Tensor g_loss = loss ? output_grad(y) : torch::Tensor();
  dev.synchronize();
  const std::int64_t live1 = dev.memory.live();
  memory_phase("forward", fwd_ts_us, live0);
  x_copy = torch::Tensor();
  m.bytes_peak_fwd = static_cast<double>(dev.memory.peak() - live0);
  m.output_shape = shape_of(y);
  m.bytes_output = tensor_bytes(y);
  m.bytes_saved =
      std::max(0.0, static_cast<double>(live1 - live0) + bytes_x_copy - m.bytes_output);
  {
    torch::Tensor g = loss ? std::move(g_loss) : torch::ones_like(y);
    dev.synchronize();
    const std::int64_t live2 = dev.memory.begin_phase();
    const double bwd_ts_us = trace != nullptr ? trace->begin_us() : 0;
    backward(y, g);
    dev.synchronize();
    m.bytes_peak_bwd = static_cast<double>(dev.memory.peak() - live2);
    memory_phase("backward", bwd_ts_us, live2);
  }
  torch::Tensor output = y.detach();
  y = torch::Tensor();

  // FLOPs pass (the counter's callback keeps op inputs alive a little longer: not in the memory pass).
  {
    clear();
    flops::Count count;
    {
      flops::FlopCounter counter;
      torch::Tensor yf = unit.forward(x);
      count = counter.count();
    }
    m.flops_fwd = count.forward();
    m.flops_bwd = count.backward();
  }

  // Kernel time (CUDA with CUPTI): one more pass (also when the caller times the unit) with activity records on.
  if (dev.kernel_timer != nullptr) {
    clear();
    dev.kernel_timer->start();
    torch::Tensor yk = unit.forward(x);
    torch::Tensor g = loss ? output_grad(yk) : torch::Tensor();
    m.kernel_time_fwd_s = dev.kernel_timer->stop_s();
    if (!loss) g = torch::ones_like(yk);
    dev.kernel_timer->start();
    backward(yk, g);
    m.kernel_time_bwd_s = dev.kernel_timer->stop_s();
  }

  if (!time_it) {  // the caller times the unit in interleaved rounds (profile_model)
    clear();
    return {std::move(m), output};
  }
  // Timed passes.
  std::vector<double> fwd, bwd;
  for (int i = 0; i < options.repeats; ++i) {
    auto [f, b] = time_once(unit, x, grad_params, dev, loss, input_grad);
    fwd.push_back(f);
    bwd.push_back(b);
  }
  clear();
  const TimingStats sf = timing_stats(fwd), sb = timing_stats(bwd);
  m.time_fwd_s = sf.median_s;
  m.time_fwd_spread_s = sf.spread_s();
  m.time_bwd_s = sb.median_s;
  m.time_bwd_spread_s = sb.spread_s();
  return {std::move(m), output};
}

}  // namespace

std::vector<std::size_t> round_order(std::size_t n, int round) {
  std::vector<std::size_t> order(n);
  if (n == 0) return order;
  const std::size_t start = static_cast<std::size_t>(round) % n;
  for (std::size_t j = 0; j < n; ++j) order[j] = (start + j) % n;
  if (round % 2 == 1) std::reverse(order.begin(), order.end());
  return order;
}

namespace {

// Device-side context for a profile: memory meter, timer, synchronisation; the CPU allocator is
// installed for the lifetime of this object.
class DeviceContext {
 public:
  explicit DeviceContext(const torch::Device& device) {
    if (device.is_cpu()) {
      scoped_.emplace();
      memory_ = std::make_unique<CpuMemoryMeter>(scoped_->allocator());
      timer_ = std::make_unique<WallTimer>();
      synchronize_ = [] {};
    } else {
#if ZEROPLAN_HAVE_CUDA
      memory_ = detail::make_cuda_memory_meter(device.index());
      timer_ = detail::make_cuda_event_timer();
      synchronize_ = [] { detail::cuda_synchronize(); };
#if ZEROPLAN_HAVE_CUPTI
      kernel_timer_ = detail::make_cupti_kernel_timer();
#endif
#else
      TORCH_INTERNAL_ASSERT(false, "CUDA device without CUDA support");
#endif
    }
  }
  Devices devices() { return Devices{*memory_, *timer_, synchronize_, kernel_timer_.get()}; }

 private:
  std::optional<ScopedCpuAllocator> scoped_;
  std::unique_ptr<detail::MemoryMeter> memory_;
  std::unique_ptr<PhaseTimer> timer_;
  std::function<void()> synchronize_;
  std::unique_ptr<PhaseTimer> kernel_timer_;
};

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

}  // namespace

UnitMeasurement profile_unit(zoo::UnitModule& unit, const at::Tensor& input,
                             const ProfileOptions& options) {
  validate_options(options);
  DeviceContext ctx(input.device());
  Devices dev = ctx.devices();
  return measure(unit, input, unit.parameters(), options, dev).first;
}

ModelProfile profile_model(zoo::Model& model, const ProfileOptions& options, TraceWriter* trace) {
  validate_options(options);
  TORCH_CHECK(model.task != nullptr, "profile_model: model has no task");
  const torch::Dtype dtype = parse_dtype(options.dtype);
  const torch::Device device = parse_device(options.device);
  if (options.threads > 0) torch::set_num_threads(options.threads);
  retain_freed_host_memory();  // as every rank of a run does (host_heap.h)

  std::vector<int> batches = options.batches.empty()
                                 ? std::vector<int>{options.batch, 2 * options.batch}
                                 : options.batches;
  if (std::find(batches.begin(), batches.end(), options.batch) == batches.end()) {
    batches.push_back(options.batch);
  }
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());

  for (auto& unit : model.units) move_module(*unit.module, device, dtype);
  std::vector<torch::Tensor> all_params;
  for (auto& unit : model.units) {
    for (auto& p : unit.module->parameters()) all_params.push_back(p);
  }

  ModelProfile profile;
  profile.name = model.preset.empty() ? model.name : model.preset;
  profile.source = "zoo:" + model.name + (model.preset.empty() ? "" : "/" + model.preset);
  profile.measured = true;
  profile.dtype = options.dtype;
  profile.threads = torch::get_num_threads();
  // Ranks on GPUs compute on devices of their own: only CPU ranks share what a unit runs on.
  const int concurrent = device.is_cpu() ? options.concurrent_ranks : 1;
  profile.concurrent_ranks = concurrent;
  profile.backward_adds_grads = true;
  profile.library_versions = {{"torch", TORCH_VERSION}, {"zeroplan", ZEROPLAN_VERSION}};
  profile.batch = options.batch;
  profile.profiled_batches = batches;
  const auto ref = static_cast<std::size_t>(  // the reference batch's index
      std::find(batches.begin(), batches.end(), options.batch) - batches.begin());
#if ZEROPLAN_HAVE_CUDA
  profile.device = device.is_cuda() ? detail::cuda_device_name(device.index()) : "cpu";
#else
  profile.device = "cpu";
#endif

  // measurements[batch index][unit index]. Memory and FLOPs per batch, unit by unit; then the times
  // in `repeats` interleaved rounds (every batch and unit once per round), so a slow or fast spell of
  // a shared machine spreads over all units instead of landing on some of them.
  std::vector<std::vector<UnitMeasurement>> measurements;
  std::vector<std::vector<torch::Tensor>> inputs;  // [batch][unit]: the unit's input, for the rounds
  std::vector<LossFn> losses;                      // [batch]: the task's loss for the last unit
  std::vector<std::string> noisy_notes;            // units whose times spread after re-measuring
  DeviceContext ctx(device);
  std::optional<ProfilerTrace> profiler_trace;
  if (trace != nullptr) profiler_trace.emplace(*trace);
  ProfilerTrace* traced = profiler_trace ? &*profiler_trace : nullptr;
  for (int b : batches) {
    Devices dev = ctx.devices();
    dev.trace = traced;
    zoo::Batch data = model.task->batch(static_cast<std::int64_t>(options.data_seed), 0, b);
    torch::Tensor x = data.input.to(device);
    if (x.is_floating_point()) x = x.to(dtype);
    if (b == options.batch) {
      profile.input_shape = shape_of(x);
      const auto sample = model.task->sample_shape();
      if (sample.size() == 1 && !x.is_floating_point()) profile.seq_len = sample[0];
      if (sample.size() == 3) profile.image_size = sample[1];
    }
    std::vector<UnitMeasurement> row;
    std::vector<torch::Tensor> row_inputs;
    for (std::size_t i = 0; i < model.units.size(); ++i) {
      if (options.progress) {
        std::fprintf(stderr, "profile: batch %d unit %zu/%zu %s\n", b, i + 1, model.units.size(),
                     model.units[i].name.c_str());
      }
      LossFn loss;
      if (i + 1 == model.units.size()) {
        torch::Tensor target = data.target.to(device);
        // In fp32 as the executor computes it (autocast's rule for losses): at a 16-bit dtype the fp32
        // copy of the logits and the loss's fp32 temporaries are part of the last unit's forward peak.
        loss = [&model, target](const torch::Tensor& y) { return model.task->loss(y.to(torch::kFloat32), target); };
      }
      try {
        row_inputs.push_back(x);
        if (loss) losses.push_back(loss);
        const TracedPhase phase{model.units[i].name, static_cast<int>(i), b, -1};
        // The model's input never needs a gradient in a training step (the executor differentiates only
        // against later units' inputs): the first unit's backward computes none.
        auto [m, out] = measure(*model.units[i].module, x, all_params, options, dev, loss, /*time_it=*/false, &phase,
                                /*input_grad=*/i > 0);
        row.push_back(std::move(m));
        x = out;
      } catch (const c10::Error& e) {
        throw SchemaError(c10::str("profile: unit ", model.units[i].name, " at batch ", b, " failed: torch: ",
                                   zoo::torch_cause(e)));
      }
    }
    measurements.push_back(std::move(row));
    inputs.push_back(std::move(row_inputs));
  }
  {
    Devices dev = ctx.devices();
    dev.trace = traced;
    const std::size_t nb = batches.size(), nu = model.units.size();
    std::vector<std::vector<double>> fwd(nb * nu), bwd(nb * nu), loss_times(nb);
    // The backward as the executor runs it: every parameter's gradient added into a buffer.
    std::vector<torch::Tensor> accum = zeroed_like(all_params);
    // The run's other local ranks, each running a training step at the batch being timed, started with
    // the timed one's (as a run's ranks start each step together after its collectives).
    std::optional<ConcurrentRanks> others;
    if (concurrent > 1) {
      auto work = [&](int bi, std::vector<torch::Tensor>& acc) {
        const auto b = static_cast<std::size_t>(bi);
        step_pass(model.units, inputs[b][0], losses[b], all_params, acc, nullptr, 0, 0, nullptr, nullptr);
      };
      others.emplace(concurrent - 1, options.threads, work, all_params);
    }
    // Timed in step order: one training step's forward and backward of every unit per batch and round.
    auto timed = [&](std::size_t bi, int repeat) {
      if (others) others->step(static_cast<int>(bi));
      std::vector<double> f(nu, 0.0), g(nu, 0.0);
      double l = 0;
      step_pass(model.units, inputs[bi][0], losses[bi], all_params, accum, &dev, batches[bi], repeat, f.data(),
                g.data(), &l);
      loss_times[bi].push_back(l);
      for (std::size_t i = 0; i < nu; ++i) {
        fwd[bi * nu + i].push_back(f[i]);
        bwd[bi * nu + i].push_back(g[i]);
      }
    };
    for (int r = 0; r < options.repeats; ++r) {
      if (options.progress) std::fprintf(stderr, "profile: timing round %d/%d\n", r + 1, options.repeats);
      for (const std::size_t bi : round_order(nb, r)) timed(bi, r);
    }
    // A unit whose times spread over more than a quarter of their median (and over 0.2 ms: below that
    // the spread moves no step) has its batch measured again (as many steps more); if it still spreads,
    // the profile says so.
    auto noisy = [](const std::vector<double>& v) {
      const TimingStats t = timing_stats(v);
      return v.size() >= 3 && t.spread_s() > std::max(0.25 * t.median_s, 2e-4);
    };
    for (std::size_t bi = 0; bi < nb; ++bi) {
      bool again = false;
      for (std::size_t i = 0; i < nu; ++i) again = again || noisy(fwd[bi * nu + i]) || noisy(bwd[bi * nu + i]);
      if (!again) continue;
      for (int r = 0; r < options.repeats; ++r) timed(bi, options.repeats + r);
      for (std::size_t i = 0; i < nu; ++i) {
        const std::size_t k = bi * nu + i;
        for (auto [v, what] : {std::pair{&fwd[k], "forward"}, std::pair{&bwd[k], "backward"}}) {
          if (!noisy(*v)) continue;
          const TimingStats t = timing_stats(*v);
          noisy_notes.push_back(c10::str("unit ", model.units[i].name, " at batch ", batches[bi], ": ", what,
                                         " times spread ", static_cast<int>(100 * t.spread_s() / t.median_s),
                                         "% of their median (p10-p90 over ", v->size(),
                                         " samples, measured twice): the machine was busy; re-profile when it is quiet"));
        }
      }
    }
    if (others) {
      const std::string error = others->error();
      others.reset();
      if (!error.empty())
        throw SchemaError("profile: a concurrent rank's thread failed: " + error.substr(0, error.find('\n')));
      profile.rank_skew = lock_step_skew(model.units, inputs[ref][0], losses[ref], all_params, concurrent,
                                         options.threads, std::max(10, 2 * options.repeats));
    }
    for (std::size_t bi = 0; bi < nb; ++bi) {
      for (std::size_t i = 0; i < nu; ++i) {
        UnitMeasurement& m = measurements[bi][i];
        // Trimmed means: a step sums its units' times, the slow samples included.
        const TimingStats sf = timing_stats(fwd[bi * nu + i]), sb = timing_stats(bwd[bi * nu + i]);
        m.time_fwd_s = sf.trimmed_mean_s;
        m.time_fwd_spread_s = sf.spread_s();
        m.time_bwd_s = sb.trimmed_mean_s;
        m.time_bwd_spread_s = sb.spread_s();
        if (i + 1 == nu) m.time_loss_s = timing_stats(loss_times[bi]).trimmed_mean_s;
      }
    }
  }

  std::vector<double> xs(batches.begin(), batches.end());
  for (std::size_t i = 0; i < model.units.size(); ++i) {
    const UnitMeasurement& r = measurements[ref][i];
    UnitProfile u;
    u.name = model.units[i].name;
    u.type = model.units[i].type;
    u.count = 1;
    u.params = r.params;
    u.bytes_param = r.bytes_param;
    u.bytes_buffer = r.bytes_buffer;
    u.input_shape = r.input_shape;
    u.output_shape = r.output_shape;
    auto figure = [&](double UnitMeasurement::*field) {
      std::vector<double> ys;
      for (const auto& row : measurements) ys.push_back(row[i].*field);
      Figure f{r.*field, fit_linear(xs, ys), {}};
      for (std::size_t k = 0; k < xs.size(); ++k) f.measured.push_back({xs[k], ys[k]});
      std::sort(f.measured.begin(), f.measured.end());
      f.measured.erase(std::unique(f.measured.begin(), f.measured.end(),
                                   [](const auto& a, const auto& b) { return a[0] == b[0]; }),
                       f.measured.end());
      return f;
    };
    u.bytes_saved = figure(&UnitMeasurement::bytes_saved);
    u.bytes_output = figure(&UnitMeasurement::bytes_output);
    u.time_fwd_s = figure(&UnitMeasurement::time_fwd_s);
    u.time_bwd_s = figure(&UnitMeasurement::time_bwd_s);
    u.time_fwd_spread_s = figure(&UnitMeasurement::time_fwd_spread_s);
    u.time_bwd_spread_s = figure(&UnitMeasurement::time_bwd_spread_s);
    u.bytes_peak_fwd = figure(&UnitMeasurement::bytes_peak_fwd);
    u.bytes_peak_bwd = figure(&UnitMeasurement::bytes_peak_bwd);
    u.flops_fwd = figure(&UnitMeasurement::flops_fwd);
    u.flops_bwd = figure(&UnitMeasurement::flops_bwd);
    if (r.kernel_time_fwd_s > 0) u.kernel_time_fwd_s = figure(&UnitMeasurement::kernel_time_fwd_s);
    if (r.bytes_peak_fwd_without_loss > 0)
      u.bytes_peak_fwd_without_loss = figure(&UnitMeasurement::bytes_peak_fwd_without_loss);
    if (r.time_loss_s > 0) u.time_loss_s = figure(&UnitMeasurement::time_loss_s);
    if (r.kernel_time_bwd_s > 0) u.kernel_time_bwd_s = figure(&UnitMeasurement::kernel_time_bwd_s);
    u.saved_tensors = r.saved_tensors;
    for (const zoo::BorrowedParam& b : model.units[i].borrowed) {
      const auto owned = model.units[static_cast<std::size_t>(b.owner_unit)].module->named_parameters();
      const torch::Tensor* p = owned.find(b.owner_name);
      TORCH_CHECK(p != nullptr, "unit ", u.name, " borrows ", b.owner_name, " which unit ", b.owner_unit, " does not have");
      auto same = std::find_if(u.borrowed.begin(), u.borrowed.end(), [&](const BorrowedParams& x) { return x.unit == b.owner_unit; });
      if (same == u.borrowed.end()) u.borrowed.push_back({b.owner_unit, p->numel()});
      else same->params += p->numel();
    }
    // A time that falls as the batch grows is noise, not a cost: the fit extrapolates it wrongly (a
    // fall over the profiled batches above 0.1 ms and a tenth of the value is flagged).
    for (auto [fig, what] : {std::pair{&u.time_fwd_s, "forward"}, std::pair{&u.time_bwd_s, "backward"}}) {
      const double fall_s = -fig->fit.per_sample * (batches.back() - batches.front());
      if (fig->fit.points >= 2 && fall_s > std::max(1e-4, 0.1 * fig->value)) {  // a fall that matters
        profile.notes.push_back(c10::str("unit ", u.name, ": ", what, " time falls with the batch (",
                                         fig->fit.per_sample * 1e3, " ms per sample over batches ",
                                         c10::Join(",", batches), "): the machine was busy; re-profile when it is quiet"));
      }
    }
    profile.units.push_back(std::move(u));
  }
  profile.notes.insert(profile.notes.end(), noisy_notes.begin(), noisy_notes.end());
  return profile;
}

}  // namespace zeroplan
