// Evaluating one candidate: prune it with the analytic memory bound, simulate it, and fit its
// continuous knobs (the smallest activation offload ratio that fits, the cheapest checkpointed units).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/profiles/prediction.h"
#include "zeroplan/tuner/constraints.h"
#include "zeroplan/tuner/evaluator.h"
#include "zeroplan/tuner/space.h"

namespace zeroplan::tuner {

// Bytes a plan may use per rank: capacity minus headroom (compared with PoolPeak::total_bytes()). The
// host's memory is a node's, shared by the ranks a node runs (min(devices per node, world size)): each
// rank may use its share of what the headroom leaves.
struct MemoryLimits {
  std::int64_t device_bytes = 0;
  std::int64_t host_bytes = 0;
};
MemoryLimits memory_limits(const ClusterProfile& cluster, const TuneConstraints& constraints, int world_size);

// Activation offload ratios are searched on this grid (the smallest multiple of it that fits).
inline constexpr double kRatioStep = 0.01;

enum class Status {
  fits,               // simulated and fits
  out_of_memory_bound,  // pruned: the analytic bound already exceeds the limit (never simulated)
  out_of_memory,      // simulated, does not fit in any variant tried
  error,              // the simulator refused the plan
  dominated,          // pruned: top_k plans are faster than its step-time bound (never simulated), or than
                      // the bound of every variant it had left when none had fitted
};
std::string_view to_string(Status s);

struct Outcome {
  Status status = Status::error;
  Plan plan;               // fits: the plan chosen; otherwise the most memory-saving variant tried
  Prediction prediction;   // of `plan` when simulated (fits, out_of_memory)
  std::int64_t device_excess_bytes = 0;  // out of memory: bytes above the device limit (bound: at least this)
  std::int64_t host_excess_bytes = 0;    // out of memory: bytes above the host limit
  std::string error;       // status error: the simulator's message
  int simulations = 0;     // simulator calls spent on this candidate
  int bound_prunes = 0;    // variants the bound ruled out without simulating
};

// Checkpointing options cheapest first: none, then growing sets of profile units ordered by forward
// time (FLOPs when the profile has no times) per byte of saved activations they free (units freeing
// under 1% of what checkpointing everything frees are never checkpointed), the full set written as
// "all" when it covers every unit.
std::vector<Checkpointing> checkpointing_levels(const ModelProfile& model);

struct SearchOptions {
  bool prune = true;  // use the analytic bounds (false: simulate everything, for brute-force checks)
  // With prune: the top_k-th fastest fitting step time found so far (tune.cpp). A variant whose step-time
  // lower bound is above it cannot be ranked, nor can those after it (more units checkpointed, more
  // recompute): they are not simulated.
  double rank_cutoff_s = std::numeric_limits<double>::infinity();
};

// Evaluates one candidate. Assumes (and the simulator's monotonicity tests check) that raising the
// activation ratio or checkpointing more units never raises device memory and never lowers step time,
// so the fastest fitting variant of a checkpointing level is its smallest fitting ratio, and once a
// level fits with no offload, later levels are slower.
Outcome evaluate_candidate(const Candidate& candidate, const ModelProfile& model, const Evaluator& evaluator,
                           const MemoryLimits& limits, const SearchOptions& options = {});

// True when `prediction` fits `limits`.
bool fits(const Prediction& prediction, const MemoryLimits& limits);

// Strict weak order of fitting outcomes, best first: step time, then device peak, then host peak.
bool faster(const Prediction& a, const Prediction& b);

}  // namespace zeroplan::tuner
