// A fast analytic lower bound of a plan's peak memory, for pruning in the tuner: O(units), no task graph.
// It never exceeds what simulate() reports: it counts the model states resident for the whole step plus
// the largest single allocation the step must make while they are resident.
#pragma once

#include <cstdint>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"

namespace zeroplan::sim {

struct MemoryBound {
  std::int64_t device_bytes = 0;        // <= simulated device peak_bytes (allocator overhead excluded)
  std::int64_t host_bytes = 0;          // <= simulated host total_bytes() (pinned blocks rounded on GPUs)
  std::int64_t device_model_state_bytes = 0;  // params + grads + optimizer resident on the device
  std::int64_t host_model_state_bytes = 0;
};

// REQUIRES: validate(plan) and validate(plan, model) pass.
MemoryBound memory_lower_bound(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan);

// A lower bound of simulate(plan).step_time_s (default SimOptions, any collective_algo), cheap (O(units)
// and, pipelined, O(stages x microbatches); no task graph), for the tuner's pruning (time_bound.cpp):
//  - pipelined plans: each stage's forwards, backwards and recomputes (of checkpointed units; of the stage
//    in pipeline-checkpointed microbatches) replayed in its schedule's order, a forward after the previous
//    stage's forward of its microbatch and a backward after the next stage's backward of it, with free
//    sends and collectives, and the activation-offload copies a stage's compute waits for (profiles
//    without saved-tensor lists);
//  - other plans: the larger of the compute stream's forwards, recomputes and backwards and the
//    collectives' stream (stages 0-1: one all-reduce of the gradients; stage 2: a reduce-scatter of them
//    per microbatch; stages 1-2: the all-gather of the updated parameters; stage 3: the larger of the
//    gathers of the parameters and the reduce-scatters of the gradients), each at the cheapest split of its
//    bytes into buckets (OffloadModel: its compute only);
// plus LocalSGD's amortised averaging. Checkpointing more units only raises it; checkpoint offload leaves
// it as it is (its copies are not counted); a higher activation offload ratio never lowers it (ratio 0: the
// lowest), while memory_lower_bound's device bytes never rise with the ratio. REQUIRES: as memory_lower_bound.
double step_time_lower_bound(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan);

}  // namespace zeroplan::sim
