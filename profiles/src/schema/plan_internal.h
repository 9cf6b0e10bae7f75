// Private to the Plan schema (plan.cpp reads and writes it, plan_validate.cpp holds its rules): its error,
// limits, and the JSON forms its messages quote.
#pragma once

#include <cstdint>
#include <string>

#include "json_util.h"
#include "zeroplan/profiles/plan.h"

namespace zeroplan::detail {

inline constexpr const char* kPlanWhere = "plan";
inline constexpr std::int64_t kMaxPrefetchBytes = 1000000000000000;  // 1e15 bytes

[[noreturn]] inline void plan_error(const std::string& message) { fail(kPlanWhere, message); }

inline bool is_dtype(const std::string& d) { return d == "fp32" || d == "fp16" || d == "bf16"; }

ojson write_checkpointing(const Checkpointing& c);
ojson write_loss_scale(const LossScale& s);

}  // namespace zeroplan::detail
