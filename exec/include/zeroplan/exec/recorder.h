// Measurement of a rank's steps: per-phase seconds per step, and spans on the simulator's lanes
// (compute, comm, h2d, d2h, optimizer) written as a Chrome trace (ts/dur in microseconds).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace zeroplan::exec {

enum class Lane { compute = 0, comm = 1, h2d = 2, d2h = 3, optimizer = 4 };
const char* lane_name(Lane lane);

class Recorder {
 public:
  explicit Recorder(int rank, bool keep_spans = true);

  double now_s() const;  // since construction

  void begin_step(int step, bool warmup);
  // Phase seconds of the step begun last.
  std::map<std::string, double> end_step();

  void add_phase(const std::string& phase, double seconds);
  // A span on a lane; also adds (t1 - t0) to `phase` when it is not empty.
  void span(Lane lane, const std::string& name, double t0_s, double t1_s, const std::string& phase,
            int unit = -1, int microbatch = -1);

  std::string chrome_trace_json() const;

 private:
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
  std::vector<Span> spans_;
};

}  // namespace zeroplan::exec
