// Private helpers shared by the report writers.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zeroplan/profiles/prediction.h"
#include "zeroplan/tuner/tune.h"

namespace zeroplan::tuner::report {

inline const std::array<const char*, 6> kCategories = {"params", "grads", "optimizer", "activations", "buffers", "overhead"};

// Bytes at the device peak by category; the allocator overhead counts as "overhead".
std::map<std::string, std::int64_t> device_by_category(const Prediction& p);
// The resource times of a prediction in a fixed order: compute first, then the rest by name.
std::vector<std::pair<std::string, double>> resource_times(const Prediction& p);
// "zero_stage 3, reshard, ..." (one line).
std::string summary(const Plan& p);
// The knobs that differ from the naive default, as "knob value" strings.
std::vector<std::string> knobs_vs_default(const Plan& p, const TuneResult& r);

}  // namespace zeroplan::tuner::report
