// RunRecord ("zeroplan.run_record/1"): what a real run of a plan measured.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "zeroplan/profiles/plan.h"

namespace zeroplan {

struct RunEnvironment {
  std::string hostname;
  std::string backend;          // "gloo" | "shm" (CPU ranks of one host, shared memory) | "nccl"
  std::string device;           // "cpu", "cuda", device name
  int threads_per_rank = 1;
  std::string torch_version;
  std::string zeroplan_version;
  int ranks = 1;
  // The machine while the measured steps ran (Linux /proc; optional, -1 / 0 when unknown): cores, and
  // how many of them other programs kept busy on average (all busy CPU time minus the ranks' own).
  int cores = 0;
  double other_load_cores = -1;

  bool operator==(const RunEnvironment&) const = default;
};

// Peak bytes of each pool on one rank.
struct RankPeak {
  int rank = 0;
  std::int64_t device_peak_bytes = 0;
  std::int64_t host_peak_bytes = 0;
  std::string device_peak_at;       // the span during which the device peak was reached, e.g.
                                    // "forward head (step 1, microbatch 0)"; "" when not known
  // What the host pool's allocator held at most (optional, 0 when not known): on CUDA the pinned blocks
  // of PyTorch's caching host allocator, each rounded to a power of two and kept for reuse
  // (host_allocator.h), >= host_peak_bytes; on CPU the requested bytes' high-water mark.
  std::int64_t host_reserved_bytes = 0;

  bool operator==(const RankPeak&) const = default;
};

// One unit's forward and backward time of one microbatch (the step's time in the unit over its
// microbatches; the loss is the last unit's forward, a checkpointed unit's recompute in neither), median
// over the measured steps, the slowest rank's. Optional; `zeroplan run` fills it.
struct UnitPhaseTime {
  std::string name;
  double fwd_s = 0;
  double bwd_s = 0;

  bool operator==(const UnitPhaseTime&) const = default;
};

// One stage of a pipelined run (pipeline_stages > 1): its ranks (stage-major: stage x dp + replica), the
// largest peaks among them, and its compute's share of the steps. Optional; `zeroplan run` fills it.
struct RunStage {
  int stage = 0;
  int first_unit = 0;              // the model's index of its first unit
  int units = 0;
  std::vector<int> ranks;
  std::int64_t device_peak_bytes = 0;
  std::int64_t host_peak_bytes = 0;
  double compute_busy_s = 0;       // forward, recompute, backward and loss per step (median over measured steps)

  bool operator==(const RunStage&) const = default;
};

// Activation offload (offload.activations_ratio > 0), one entry per unit of one microbatch (every
// microbatch alike): the saved tensors the unit alone keeps and those the executor sent to the host
// (activation_offload.h's policy). Optional; `zeroplan run` fills it.
struct OffloadedActivations {
  int unit = 0;                  // the model's index
  std::string name;
  int tensors = 0, offloaded = 0;
  std::int64_t bytes = 0, offloaded_bytes = 0;

  bool operator==(const OffloadedActivations&) const = default;
};

struct RunRecord {
  std::string model;                 // ModelProfile::name / zoo name
  Plan plan;
  RunEnvironment environment;
  int warmup_steps = 0;              // the first warmup_steps entries of step_times_s are warm-up
  std::vector<double> step_times_s;  // every step, warm-up included
  double step_time_median_s = 0;     // over the steps after warm-up
  double step_time_p10_s = 0;
  double step_time_p90_s = 0;
  std::map<std::string, double> phase_times_s;  // phase ("forward", "backward", "optimizer", ...) -> median s/step
  std::vector<RankPeak> peaks;       // one per rank, by rank
  std::vector<double> losses;        // per step (NaN allowed, written as null)
  std::vector<double> loss_scales;   // per step, with loss scaling: the scale the step's gradients carried
  std::vector<int> skipped_steps;    // steps whose optimizer update was skipped (non-finite gradients)
  std::vector<UnitPhaseTime> units;  // optional
  std::vector<double> lr_gains;      // AdaScale's learning-rate gain per step (optional: empty without it)
  std::vector<std::string> fallbacks;     // "gloo reduce_scatter via all_reduce"
  std::vector<std::string> trace_paths;   // one per rank, or empty
  // Pipelined runs: per stage, and the measured bubble: the share of the ranks' time from the step's
  // start to their last backward that their compute idled (1 - busy / span summed over ranks and
  // measured steps; the simulator's Prediction::bubble_fraction). Optional: empty / 0 otherwise.
  std::vector<RunStage> stages;
  double bubble_fraction = 0;
  std::vector<OffloadedActivations> offloaded_activations;

  // step_times_s after warm-up.
  std::vector<double> measured_step_times_s() const;
  // Sets median/p10/p90 from measured_step_times_s() (linear interpolation between order statistics,
  // as numpy.percentile). REQUIRES: at least one measured step.
  void compute_step_statistics();

  bool operator==(const RunRecord&) const;
};

inline constexpr const char* kRunRecordSchema = "zeroplan.run_record/1";

// Percentile q in [0, 100] of `values` with linear interpolation (numpy default). REQUIRES: non-empty.
double percentile(std::vector<double> values, double q);

// Throws SchemaError: warmup_steps in [0, steps), at least one measured step, times > 0,
// p10 <= median <= p90, environment.ranks == plan.world_size, one peak per rank (ranks 0..n-1),
// trace_paths empty or one per rank, losses at most one per step, known backend.
void validate(const RunRecord& record);

void to_json(nlohmann::json& j, const RunRecord& record);
void from_json(const nlohmann::json& j, RunRecord& record);
// One entry of RunRecord::offloaded_activations, as the record writes it (also RunResult's JSON).
void to_json(nlohmann::json& j, const OffloadedActivations& o);
void from_json(const nlohmann::json& j, OffloadedActivations& o);

}  // namespace zeroplan
