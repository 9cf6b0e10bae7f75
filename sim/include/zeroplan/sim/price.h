// The price of approximate averaging: a LocalSGD, SlowMo or AdaScale run's loss beside a synchronous
// (DDP) run of the same model, seed and global batch, after the same steps, with both step times.
#pragma once

#include <string>

#include "zeroplan/profiles/comparison.h"
#include "zeroplan/profiles/run_record.h"

namespace zeroplan::sim {

// True for plans whose replicas do not see every gradient every step or whose step is rescaled:
// LocalSGD (and SlowMo on it) or AdaScale.
bool approximate_averaging(const Plan& plan);

// "LocalSGD every 4 steps", "SlowMo every 4 steps (momentum 0.5, slow lr 1)", "AdaScale".
std::string averaging_strategy(const Plan& plan);

// The price of `run` against `baseline` (whose path is recorded). Throws SchemaError in one line when
// they are not comparable: `run` not approximate or `baseline` not synchronous, another model, world
// size, global batch, micro batch, seed or optimizer, or a non-finite loss in the steps compared.
AveragingPrice averaging_price(const RunRecord& run, const RunRecord& baseline, const std::string& baseline_path);

}  // namespace zeroplan::sim
