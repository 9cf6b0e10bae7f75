// The loss a LocalSGD, SlowMo or AdaScale run gives up against a DDP run, and the speed it buys.
#include "zeroplan/sim/price.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

#include "zeroplan/profiles/errors.h"

namespace zeroplan::sim {

bool approximate_averaging(const Plan& plan) { return plan.localsgd() || plan.adascale; }

std::string averaging_strategy(const Plan& plan) {
  std::string s;
  if (plan.slowmo()) {
    s = fmt::format("SlowMo every {} steps (momentum {:g}, slow lr {:g})", plan.localsgd_frequency, plan.slowmo_momentum,
                    plan.slowmo_lr);
  } else if (plan.localsgd()) {
    s = fmt::format("LocalSGD every {} steps", plan.localsgd_frequency);
  }
  if (plan.localsgd() && plan.localsgd_warmup_steps > 0) s += fmt::format(" after {} synchronous", plan.localsgd_warmup_steps);
  if (plan.adascale) s += s.empty() ? "AdaScale" : " + AdaScale";
  return s.empty() ? "synchronous" : s;
}

namespace {

[[noreturn]] void not_comparable(const std::string& what) {
  throw SchemaError("compare --baseline: " + what);
}

// Mean over the last quarter (at least one) of the first `steps` losses.
double tail_mean(const std::vector<double>& losses, int steps, const char* which) {
  const int k = std::max(1, steps / 4);
  double sum = 0;
  for (int i = steps - k; i < steps; ++i) {
    const double v = losses[static_cast<std::size_t>(i)];
    if (!std::isfinite(v)) not_comparable(fmt::format("the {} run's loss at step {} is {}", which, i, v));
    sum += v;
  }
  return sum / k;
}

}  // namespace

AveragingPrice averaging_price(const RunRecord& run, const RunRecord& baseline, const std::string& baseline_path) {
  const Plan& p = run.plan;
  const Plan& b = baseline.plan;
  if (!approximate_averaging(p))
    not_comparable("the measured run is synchronous (a price needs a LocalSGD, SlowMo or AdaScale run)");
  if (approximate_averaging(b))
    not_comparable(fmt::format("the baseline must be synchronous, it ran {}", averaging_strategy(b)));
  if (run.model != baseline.model) not_comparable(fmt::format("models differ: {} and baseline {}", run.model, baseline.model));
  auto same = [](const char* what, auto x, auto y) {
    if (x != y) not_comparable(fmt::format("{} differs: {} and baseline {}", what, x, y));
  };
  same("world_size", p.world_size, b.world_size);
  same("global_batch", p.global_batch, b.global_batch);
  same("seed", p.seed, b.seed);
  same("optimizer", p.optimizer.name, b.optimizer.name);
  same("lr", p.optimizer.lr, b.optimizer.lr);
  const int steps = static_cast<int>(std::min(run.losses.size(), baseline.losses.size()));
  if (steps < 1) not_comparable("a run has no losses");
  AveragingPrice price;
  price.baseline = baseline_path;
  price.strategy = averaging_strategy(p);
  price.steps = steps;
  price.loss = tail_mean(run.losses, steps, "measured");
  price.baseline_loss = tail_mean(baseline.losses, steps, "baseline");
  price.loss_change = relative_error(price.loss, price.baseline_loss);
  price.step_time_s = run.step_time_median_s;
  price.baseline_step_time_s = baseline.step_time_median_s;
  price.speedup = price.baseline_step_time_s / price.step_time_s;
  return price;
}

}  // namespace zeroplan::sim
