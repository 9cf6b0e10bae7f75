// The profiler's statistics: phase timers, timing statistics over repeats, the linear fits over batches,
// and the order of the timing rounds.
#include <torch/torch.h>
#include <zeroplan/config.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "device.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/profiler.h"

namespace zeroplan {

std::unique_ptr<PhaseTimer> make_phase_timer(const std::string& device) {
  if (device == "cpu") return std::make_unique<WallTimer>();
  if (device.rfind("cuda", 0) == 0) {
#if ZEROPLAN_HAVE_CUDA
    return detail::make_cuda_event_timer();
#else
    throw SchemaError("device '" + device + "': this build of zeroplan has no CUDA");
#endif
  }
  throw SchemaError("device '" + device + "': expected cpu, cuda or cuda:N");
}

namespace {

double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}
}  // namespace

TimingStats timing_stats(std::vector<double> samples_s) {
  std::sort(samples_s.begin(), samples_s.end());
  const std::size_t n = samples_s.size(), cut = n / 10;
  double sum = 0;
  for (std::size_t i = cut; i + cut < n; ++i) sum += samples_s[i];
  const double trimmed = n > 2 * cut ? sum / static_cast<double>(n - 2 * cut) : 0.0;
  return TimingStats{quantile(samples_s, 0.5), quantile(samples_s, 0.1), quantile(samples_s, 0.9), trimmed};
}

Fit fit_linear(const std::vector<double>& batches, const std::vector<double>& values) {
  TORCH_INTERNAL_ASSERT(batches.size() == values.size() && !batches.empty());
  const auto n = static_cast<double>(batches.size());
  if (batches.size() == 1) {
    return Fit{0, batches[0] != 0 ? values[0] / batches[0] : 0, 1, 1};
  }
  const double mx = std::accumulate(batches.begin(), batches.end(), 0.0) / n;
  const double my = std::accumulate(values.begin(), values.end(), 0.0) / n;
  double sxx = 0, sxy = 0, syy = 0;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    sxx += (batches[i] - mx) * (batches[i] - mx);
    sxy += (batches[i] - mx) * (values[i] - my);
    syy += (values[i] - my) * (values[i] - my);
  }
  Fit fit;
  fit.points = static_cast<int>(batches.size());
  fit.per_sample = sxx > 0 ? sxy / sxx : 0;
  fit.intercept = my - fit.per_sample * mx;
  double ss_res = 0;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const double r = values[i] - fit.at(batches[i]);
    ss_res += r * r;
  }
  // Exactly linear (or constant) values fit perfectly; guard the 0/0 and rounding noise.
  fit.r2 = (syy <= 1e-24 * std::max(1.0, my * my)) ? 1.0 : std::clamp(1.0 - ss_res / syy, -1e300, 1.0);
  return fit;
}

std::vector<std::size_t> round_order(std::size_t n, int round) {
  std::vector<std::size_t> order(n);
  if (n == 0) return order;
  const std::size_t start = static_cast<std::size_t>(round) % n;
  for (std::size_t j = 0; j < n; ++j) order[j] = (start + j) % n;
  if (round % 2 == 1) std::reverse(order.begin(), order.end());
  return order;
}

}  // namespace zeroplan
