// Pipeline stage balance: which consecutive units each stage of a pipelined plan runs. One function, so
// the simulator, its memory bound and the exports split a model the same way.
//
//   std::vector<int> b = pipeline_balance(plan, model);   // units per stage, e.g. {25, 24, 24, 25}
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"

namespace zeroplan {

// Units per stage (expanded units, in order; pipeline_stages entries, each >= 1, summing to the expanded
// unit count): the plan's list when it gives one, else the contiguous split that minimises the heaviest
// stage (fairscale's blockpartition), weighing each unit by
//  - time: its profiled forward + backward time at the plan's micro batch (fairscale balance_by_time),
//    or its forward + backward FLOPs when the profile has no times (analytic profiles), or 1;
//  - memory: 2 x its parameter bytes + its saved activations at the micro batch (fairscale
//    balance_by_size with its default param_scale 2).
// Ties go to the earlier stages (the split fills stages front to back up to the least heaviest stage).
// REQUIRES: validate(plan, model) passes.
std::vector<int> pipeline_balance(const Plan& plan, const ModelProfile& model);

// One stage's compute order over the step's microbatches, shared by the simulator's lowering and the
// executor so both run the same schedule:
//   gpipe: F0 .. F(m-1), then B0 .. B(m-1);
//   1f1b:  (PipeDream-flush) min(p - s - 1, m) forwards, then a forward and a backward in turn, then the
//          backwards left: at most p - s microbatches in flight on stage s.
struct PipelineOp {
  bool forward = true;
  int microbatch = 0;
};
std::vector<PipelineOp> pipeline_order(const std::string& schedule, int stages, int stage, int microbatches);

// Whether microbatch `mb` of a pipelined plan is checkpointed (fairscale Pipe: always; except_last: all but
// the last microbatch; never): its stage keeps only its input and recomputes its forward before the backward.
bool pipeline_checkpointed(const Plan& plan, int mb);

// The contiguous split of `weights` into `parts` blocks (each >= 1 item) minimising the largest block sum.
// REQUIRES: 1 <= parts <= weights.size(), weights >= 0.
std::vector<int> balanced_blocks(const std::vector<double>& weights, int parts);

// fairscale OffloadModel's slices: the first unit of each of (at most) `slices` groups of consecutive
// units, balanced by parameter count (a slice closes once the running count reaches its share), then
// the unit count: {0, 3, 7, n}. The simulator and the executor slice a model with this one function.
// REQUIRES: slices >= 1, unit_params non-empty, every count >= 0.
std::vector<int> offload_model_slice_starts(const std::vector<std::int64_t>& unit_params, int slices);

// Each OffloadModel slice's units on the device: its own units in order, then the earlier units whose
// weights they borrow (tied weights: fairscale moves a shared parameter with whichever shard holds it),
// in the order first borrowed. `starts` as offload_model_slice_starts returns it; borrow_owners[u]: the
// units unit u borrows from. The simulator and the executor load a slice with this one function.
std::vector<std::vector<int>> offload_model_slice_members(const std::vector<int>& starts,
                                                          const std::vector<std::vector<int>>& borrow_owners);

// Stages 1-2's all-gather of the updated parameters after the optimizer step, bucketed as DeepSpeed's
// allgather_bucket_size buckets it: consecutive units with parameters share a bucket while their gathered
// bytes (`gathered_bytes[u]`, 0 for a unit without parameters, which no bucket holds) stay within
// `bucket_bytes`; a unit larger than that is a bucket alone. The simulator and the executor bucket with
// this one function. REQUIRES: bucket_bytes >= 1, every entry >= 0.
std::vector<std::vector<int>> allgather_buckets(const std::vector<std::int64_t>& gathered_bytes,
                                                std::int64_t bucket_bytes);

}  // namespace zeroplan
