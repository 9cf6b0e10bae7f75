// Private to the ModelProfile schema (model_profile.cpp reads and writes it, model_profile_validate.cpp
// holds its rules): its error.
#pragma once

#include <string>

#include "json_util.h"

namespace zeroplan::detail {

inline constexpr const char* kModelWhere = "model_profile";

[[noreturn]] inline void model_error(const std::string& message) { fail(kModelWhere, message); }

}  // namespace zeroplan::detail
