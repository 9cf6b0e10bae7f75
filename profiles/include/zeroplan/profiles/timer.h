// Timers for profiling phases and small statistics over repeated timings.
//
// A PhaseTimer times one interval of device work: start() before it, stop_s() after it returns the
// seconds of that interval. On the CPU it is a steady clock (the work is synchronous); on CUDA it is a
// pair of CUDA events on the current stream, and stop_s() synchronises the stop event. Tests use
// FakeTimer.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace zeroplan {

class PhaseTimer {
 public:
  virtual ~PhaseTimer() = default;
  virtual void start() = 0;
  virtual double stop_s() = 0;
};

class WallTimer final : public PhaseTimer {
 public:
  void start() override { t0_ = std::chrono::steady_clock::now(); }
  double stop_s() override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  std::chrono::steady_clock::time_point t0_{};
};

// Returns the given durations in turn (cycling), for tests.
class FakeTimer final : public PhaseTimer {
 public:
  explicit FakeTimer(std::vector<double> durations_s) : durations_s_(std::move(durations_s)) {}
  void start() override {}
  double stop_s() override {
    return durations_s_.empty() ? 0.0 : durations_s_[next_++ % durations_s_.size()];
  }

 private:
  std::vector<double> durations_s_;
  std::size_t next_ = 0;
};

// "cpu" -> WallTimer; "cuda" / "cuda:N" -> CUDA-event timer (throws SchemaError when this build has no
// CUDA).
std::unique_ptr<PhaseTimer> make_phase_timer(const std::string& device);

// Statistics of repeated timings: median and the p10..p90 spread (nearest-rank on the sorted sample).
struct TimingStats {
  double median_s = 0;
  double p10_s = 0;
  double p90_s = 0;
  // The mean without the n/10 largest and n/10 smallest samples: for times that add up (a step is the
  // sum of its units' times, whose slow samples count; a stray preemption does not).
  double trimmed_mean_s = 0;
  double spread_s() const { return p90_s - p10_s; }
};
TimingStats timing_stats(std::vector<double> samples_s);

}  // namespace zeroplan
