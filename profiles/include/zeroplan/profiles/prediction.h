// Prediction ("zeroplan.prediction/1"): what the simulator says one training step of a plan costs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "zeroplan/profiles/plan.h"

namespace zeroplan {

// One thing resident in a pool at its peak.
struct ResidentItem {
  std::string category;  // "params" | "grads" | "optimizer" | "activations" | "buffers" | "overhead"
  std::string name;      // "block[3].params", "bucket 2", "fp16 compute copy"
  std::int64_t bytes = 0;

  bool operator==(const ResidentItem&) const = default;
};

// Peak of one memory pool (per rank). peak_bytes = sum of resident bytes (allocations); the caching
// allocator's overhead is reported separately and is not in peak_bytes.
struct PoolPeak {
  std::int64_t peak_bytes = 0;
  std::int64_t allocator_overhead_bytes = 0;
  std::int64_t capacity_bytes = 0;     // pool size from the cluster (device.mem_bytes, host.mem_bytes)
  double at_s = 0;                     // time of the peak from the start of the step
  std::vector<ResidentItem> resident;  // what is live at the peak, largest first

  std::int64_t total_bytes() const { return peak_bytes + allocator_overhead_bytes; }
  bool fits() const { return total_bytes() <= capacity_bytes; }
  bool operator==(const PoolPeak&) const = default;
};

// Timing of one (expanded) unit in the step; for several microbatches, of the first one.
struct UnitTiming {
  std::string name;       // "block[3]"
  double fwd_start_s = 0;
  double fwd_s = 0;
  double bwd_start_s = 0;
  double bwd_s = 0;

  bool operator==(const UnitTiming&) const = default;
};

// One stage of a pipelined plan (a rank of it): its units, its peaks and how busy its compute was.
struct StagePrediction {
  int first_unit = 0;          // expanded unit index of its first unit
  int units = 0;               // expanded units it runs
  PoolPeak device;
  std::int64_t host_peak_bytes = 0;
  double compute_busy_s = 0;   // forward, backward and recompute of the step

  bool operator==(const StagePrediction&) const = default;
};

// The model states one rank holds for the whole step, sharded and placed as the plan says: what the ZeRO
// paper's Table 1 counts (16 bytes per parameter with mixed-precision Adam at stage 0, 16 / N at stage 3),
// without the transients a step also makes (gathered parameters, unsharded gradients, buckets), which the
// pools' resident lists show at the peak. Stages 2-3 count the gradient shard although it exists only from
// the first reduce-scatter to the optimizer step. Pipelined plans: the stage with the largest device peak.
struct ModelStates {
  std::int64_t device_params = 0, device_grads = 0, device_optimizer = 0;
  std::int64_t host_params = 0, host_grads = 0, host_optimizer = 0;

  std::int64_t device_bytes() const { return device_params + device_grads + device_optimizer; }
  std::int64_t host_bytes() const { return host_params + host_grads + host_optimizer; }
  bool operator==(const ModelStates&) const = default;
};

struct Prediction {
  std::string model;         // ModelProfile::name
  std::string cluster;       // ClusterProfile::name
  Plan plan;
  double step_time_s = 0;       // one optimizer step (averaged over the LocalSGD period if any)
  double sync_step_time_s = 0;  // a step that synchronises across nodes (LocalSGD); = step_time_s otherwise
  double samples_per_s = 0;     // global_batch / step_time_s
  double lower_bound_s = 0;     // max over resources of busy time, and the critical path of compute
  PoolPeak device;
  PoolPeak host;
  ModelStates model_states;  // optional in JSON (zeros when absent)
  std::map<std::string, double> resource_busy_s;  // "compute", "h2d", "d2h", "comm.intra", "host_optimizer"
  double exposed_comm_s = 0;     // communication on the critical path
  double overlapped_comm_s = 0;  // communication hidden under compute
  std::string bound;             // "compute" | "communication" | "copies" | "host_optimizer"
  std::vector<UnitTiming> units;
  // Pipelined plans (pipeline_stages > 1): per stage, and the share of the stages' time between the first
  // forward and the last backward that their compute streams idle (GPipe: (p-1)/(m+p-1) for equal
  // stages and free sends). device and host above are the largest of the stages'. Optional.
  std::vector<StagePrediction> stages;
  double bubble_fraction = 0;
  std::string trace_path;        // Chrome trace of the simulated step; optional, "" when none
  std::vector<std::string> notes;  // assumptions the simulator made; optional

  bool fits() const { return device.fits() && host.fits(); }
  bool operator==(const Prediction&) const = default;
};

inline constexpr const char* kPredictionSchema = "zeroplan.prediction/1";

// Throws SchemaError: times >= 0, step_time_s > 0, lower_bound_s <= step_time_s, samples_per_s ==
// plan.global_batch / step_time_s (relative 1e-9), bytes >= 0, known categories and bound, the plan valid.
void validate(const Prediction& prediction);

void to_json(nlohmann::json& j, const Prediction& prediction);
void from_json(const nlohmann::json& j, Prediction& prediction);

}  // namespace zeroplan
