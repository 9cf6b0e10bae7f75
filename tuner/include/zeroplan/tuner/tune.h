// The tuner: the fastest plan that fits, the ranking, the Pareto front of memory against throughput,
// what was rejected and why, and why the winner won.
//
//   TuneResult r = tune(model, cluster, TuneConstraints{}.set_global_batch(1536), TuneOptions{});
//   r.best()                 // the winner (or nullptr when nothing fits)
//   write_reports(r, dir);   // report.md, report.html, tune.json and the exports (report.h)
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/profiles/prediction.h"
#include "zeroplan/tuner/constraints.h"
#include "zeroplan/tuner/evaluator.h"
#include "zeroplan/tuner/explain.h"
#include "zeroplan/tuner/search.h"

namespace zeroplan::tuner {

struct Progress {
  std::int64_t done = 0;         // candidates evaluated
  std::int64_t total = 0;        // candidates to evaluate
  std::int64_t simulations = 0;  // simulator calls so far
  std::int64_t fitting = 0;      // candidates that fit so far
};

struct TuneOptions {
  int threads = 0;   // worker threads; 0: std::thread::hardware_concurrency()
  int top_k = 10;    // plans kept in the ranking
  bool prune = true;  // prune with the analytic memory bound before simulating
  bool explain = true;  // simulate the knob-by-knob paths of "why this plan"
  // Called from the worker threads, one call at a time, at most about 200 times per tune and once at
  // the end (done == total). Output goes wherever the callback sends it (stderr_progress_bar()).
  std::function<void(const Progress&)> progress;
  const Evaluator* evaluator = nullptr;  // nullptr: the simulator on (model, cluster); tests pass fakes

  TuneOptions& set_threads(int v) { threads = v; return *this; }
  TuneOptions& set_top_k(int v) { top_k = v; return *this; }
  TuneOptions& set_prune(bool v) { prune = v; return *this; }
  TuneOptions& set_explain(bool v) { explain = v; return *this; }
  TuneOptions& set_progress(std::function<void(const Progress&)> v) { progress = std::move(v); return *this; }
  TuneOptions& set_evaluator(const Evaluator* v) { evaluator = v; return *this; }
};

// A progress bar on stderr: "tune [#########.........] 45% 1234/2742 candidates, 3120 simulated, 12 fit".
// Redraws in place when stderr is a terminal, else prints a line every 10%.
std::function<void(const Progress&)> stderr_progress_bar();

struct RankedPlan {
  int candidate = -1;      // index into the enumerated candidates
  Plan plan;
  Prediction prediction;
  // Fitting plans folded into this one: each predicts exactly the same step time and device and host
  // totals (for this model the knobs in which it differs change nothing), so the ranking shows the plan
  // once, the first in enumeration order (default knob values first), and the next rows are real
  // alternatives. `equivalent_knobs`: the knobs (constraints.h names) in which they differ, sorted.
  int equivalents = 0;
  std::vector<std::string> equivalent_knobs;
};

// One rejected candidate kept as an example (the closest misses).
struct Rejection {
  int candidate = -1;
  Status status = Status::out_of_memory;
  Plan plan;                          // the most memory-saving variant tried
  std::int64_t device_excess_bytes = 0;  // above the device limit (for bound rejections: at least)
  std::int64_t host_excess_bytes = 0;
  std::string error;
};

struct Rejections {
  std::map<std::string, std::int64_t> invalid;  // reason -> partial combinations never simulated
  std::int64_t out_of_memory_bound = 0;   // pruned by the analytic bound, never simulated
  std::int64_t out_of_memory = 0;         // simulated, no variant fits
  std::int64_t errors = 0;                // the simulator refused them
  std::int64_t dominated = 0;             // pipelines bounded out of the ranking (top_k faster plans), never simulated
  std::map<std::string, std::int64_t> error_messages;
  std::vector<Rejection> closest;         // the out-of-memory candidates nearest to fitting, nearest first (<= 5)
  std::int64_t invalid_total() const;
};

// The naive default: DDP, no offload, no checkpointing, micro batch = global batch / world size.
struct DefaultCheck {
  Plan plan;
  bool valid = false;
  std::string invalid_reason;         // why the default is not even a plan here
  bool simulated = false;
  Prediction prediction;
  bool fits = false;
  std::int64_t device_needed_bytes = 0, device_available_bytes = 0;
  std::int64_t host_needed_bytes = 0, host_available_bytes = 0;
  std::string error;                  // the simulator's message if it refused the default
};

struct TuneResult {
  ModelProfile model;
  ClusterProfile cluster;      // as constrained (nodes)
  TuneConstraints constraints;
  MemoryLimits limits;
  int world_size = 1;
  int nodes_used = 1;
  std::vector<std::string> notes;  // decisions the tuner made (world size, knobs not searched)

  std::int64_t candidates = 0;     // enumerated and valid
  std::int64_t simulations = 0;    // simulator calls, candidates only (not the explanation)
  std::int64_t bound_prunes = 0;   // variants the analytic bound ruled out
  std::int64_t fitting = 0;        // candidates with a plan that fits
  std::vector<RankedPlan> ranking;   // best first, at most top_k, plans with identical predictions folded
                                     // into the first (RankedPlan::equivalents)
  std::vector<RankedPlan> pareto;    // every simulated fitting plan that no other beats on both device memory
                                     // and samples/s, least memory first
  struct Point {
    int candidate = -1;
    std::int64_t device_bytes = 0;
    double samples_per_s = 0;
  };
  std::vector<Point> fitting_points;  // every fitting candidate, by candidate index (for plots)
  Rejections rejections;
  DefaultCheck default_plan;
  Explanation explanation;          // empty when nothing fits or explain is off
  double wall_time_s = 0;           // not written to tune.json (it must be byte-identical across runs)

  const RankedPlan* best() const { return ranking.empty() ? nullptr : &ranking.front(); }
};

// Throws SchemaError when the constraints are unusable (see enumerate_space). Finding nothing that fits
// is a result, not an error: best() is null and the rejections say why.
TuneResult tune(const ModelProfile& model, const ClusterProfile& cluster, const TuneConstraints& constraints,
                const TuneOptions& options = {});

}  // namespace zeroplan::tuner
