// Measurement of a rank's steps: per-phase seconds per step, and spans on the simulator's lanes
// (compute, comm, h2d, d2h, optimizer) written as a Chrome trace (ts/dur in microseconds).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace zeroplan::exec {

// comm_rs: stage 3's reduce-scatters on a communicator of their own (FSDP's reduce-scatter stream).
enum class Lane { compute = 0, comm = 1, h2d = 2, d2h = 3, optimizer = 4, comm_rs = 5 };
const char* lane_name(Lane lane);

class Recorder {
 public:
  explicit Recorder(int rank, bool keep_spans = true);

  double now_s() const;  // since construction

  void begin_step(int step, bool warmup);
  // Phase seconds of the step begun last.
  std::map<std::string, double> end_step();

  void add_phase(const std::string& phase, double seconds);
  // A span on a lane; also adds (t1 - t0) to `phase` when it is not empty, and to unit `unit`'s
  // forward or backward time of the step when `phase` is "forward" or "backward" (recompute is neither,
  // as in the simulator, where a checkpointed unit's recompute is a task of its own).
  void span(Lane lane, const std::string& name, double t0_s, double t1_s, const std::string& phase,
            int unit = -1, int microbatch = -1);

  // One unit's time in the step begun last: forward and backward seconds summed over its microbatches,
  // and how many microbatches ran it.
  struct UnitStepTime {
    double fwd_s = 0;
    double bwd_s = 0;
    int microbatches = 0;
  };
  // Unit index -> its time in the step begun last (units without a forward or backward span absent).
  std::map<int, UnitStepTime> unit_times() const;

  std::string chrome_trace_json() const;

  // Peak attribution: with a probe of the device's peak bytes, each span that ends with the peak
  // higher than when the last span ended is where the peak was reached (the latest such span wins).
  void set_peak_probe(std::function<std::int64_t()> probe) { peak_probe_ = std::move(probe); }
  const std::string& peak_at() const { return peak_at_; }
  // Memory counters in the trace: with a probe of the device's live bytes, every span's end adds a
  // sample "memory device" {bytes: live, peak_bytes: the running peak}, as the simulator's trace has.
  void set_live_probe(std::function<std::int64_t()> probe) { live_probe_ = std::move(probe); }

 private:
  std::function<std::int64_t()> peak_probe_;
  std::function<std::int64_t()> live_probe_;
  struct MemorySample {
    double t_s;
    std::int64_t live, peak;
  };
  std::vector<MemorySample> memory_;
  std::int64_t peak_seen_ = -1;
  std::string peak_at_;
  struct Span {
    Lane lane;
    std::string name;
    double t0_s, t1_s;
    int unit, microbatch, step;
    bool warmup;
  };
  int rank_;
  bool keep_spans_;
  std::chrono::steady_clock::time_point origin_;
  int step_ = -1;
  bool warmup_ = false;
  std::map<std::string, double> phases_;
  struct UnitAcc {
    double fwd_s = 0, bwd_s = 0;
    std::set<int> microbatches;
  };
  std::map<int, UnitAcc> units_;  // of the step begun last
  std::vector<Span> spans_;
};

}  // namespace zeroplan::exec
