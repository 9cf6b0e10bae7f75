// Private helpers shared by the exporters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"

namespace zeroplan::tuner::exports {

int dtype_bytes(const std::string& dtype);
// Parameters of the largest unit (one repetition): what one per-unit collective moves.
std::int64_t largest_unit_params(const ModelProfile& model);
// True when the checkpointed units are exactly the units of the wrapped class (what FSDP and
// Accelerate's activation checkpointing do).
bool checkpoints_exactly_wrap_class(const Plan& plan, const ModelProfile& model);
// "none" | "all" | "units [1,3]".
std::string checkpointing_text(const Checkpointing& c);
// "off" | "8 stages, 1f1b" | "4 stages, gpipe, checkpoint except_last, balance [3,2,2,3]".
std::string pipeline_text(const Plan& plan);
// DeepSpeed's partition_method "uniform" (ds_utils.partition_uniform) of `items` layers into `parts`
// stages: items / parts each, the first items % parts stages one more.
std::vector<int> deepspeed_uniform_partition(int items, int parts);
// One line summary of a plan for comments: "zero_stage 3, reshard, micro 2 x 4, bf16, ...".
std::string plan_summary(const Plan& plan);

}  // namespace zeroplan::tuner::exports
