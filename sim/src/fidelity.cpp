#include "zeroplan/sim/fidelity.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "zeroplan/profiles/errors.h"

namespace zeroplan::sim {

std::vector<double> average_ranks(const std::vector<double>& v) {
  std::vector<std::size_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
  std::vector<double> ranks(v.size());
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
    const double r = (static_cast<double>(i) + static_cast<double>(j)) / 2 + 1;  // 1-based average
    for (std::size_t k = i; k <= j; ++k) ranks[order[k]] = r;
    i = j + 1;
  }
  return ranks;
}

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (a.size() != b.size() || a.size() < 2) return nan;
  const std::vector<double> ra = average_ranks(a), rb = average_ranks(b);
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n;
  const double mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < ra.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  if (saa == 0 || sbb == 0) return nan;
  return sab / std::sqrt(saa * sbb);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  if (n == 0) return 0;
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

namespace {

ErrorStats stats(const std::vector<FidelityRow>& rows, double FidelityRow::*predicted, double FidelityRow::*measured) {
  ErrorStats s;
  std::vector<double> errors;
  for (const FidelityRow& r : rows) {
    const double e = std::abs((r.*predicted - r.*measured) / r.*measured);
    errors.push_back(e);
    if (e > s.max_abs_error || s.max_label.empty()) {
      s.max_abs_error = e;
      s.max_label = r.label;
    }
  }
  s.median_abs_error = median(errors);
  return s;
}
}  // namespace

FidelitySummary summarize_fidelity(const std::vector<FidelityRow>& rows) {
  for (const FidelityRow& r : rows) {
    if (!(r.measured_time_s > 0) || !(r.measured_peak_bytes > 0)) {
      throw SchemaError(fmt::format("fidelity: row '{}' has measured step time {} s and peak {} bytes; both must be > 0",
                                    r.label, r.measured_time_s, r.measured_peak_bytes));
    }
  }
  FidelitySummary s;
  s.plans = static_cast<int>(rows.size());
  s.time = stats(rows, &FidelityRow::predicted_time_s, &FidelityRow::measured_time_s);
  s.memory = stats(rows, &FidelityRow::predicted_peak_bytes, &FidelityRow::measured_peak_bytes);
  std::vector<double> pt, mt, pm, mm;
  for (const FidelityRow& r : rows) {
    pt.push_back(r.predicted_time_s);
    mt.push_back(r.measured_time_s);
    pm.push_back(r.predicted_peak_bytes);
    mm.push_back(r.measured_peak_bytes);
  }
  s.time_spearman = spearman(pt, mt);
  s.memory_spearman = spearman(pm, mm);
  return s;
}

}  // namespace zeroplan::sim
