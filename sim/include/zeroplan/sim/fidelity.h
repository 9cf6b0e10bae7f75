// Fidelity over many plans: how well the simulator's predictions track measured runs, as a table and a
// few figures users judge a simulator by (median and maximum relative error of step time and of peak
// device memory, and whether the measured ranking of the plans matches the predicted one).
//
//   std::vector<FidelityRow> rows = {{"stage 0", 0.21, 0.20, 96e6, 98e6}, ...};
//   FidelitySummary s = summarize_fidelity(rows);   // s.time.median_abs_error, s.time_spearman, ...
//
// Relative errors are (predicted - measured) / measured, as in compare.h. Rank correlation is
// Spearman's rho: Pearson's correlation of the ranks, ties given their average rank.
#pragma once

#include <string>
#include <vector>

namespace zeroplan::sim {

struct FidelityRow {
  std::string label;
  double predicted_time_s = 0;
  double measured_time_s = 0;
  double predicted_peak_bytes = 0;
  double measured_peak_bytes = 0;
};

struct ErrorStats {
  double median_abs_error = 0;  // of |rel_error|
  double max_abs_error = 0;
  std::string max_label;        // the row with the largest |rel_error|
};

struct FidelitySummary {
  int plans = 0;
  ErrorStats time;
  ErrorStats memory;
  double time_spearman = 0;    // NaN when undefined (fewer than 2 rows, or one side constant)
  double memory_spearman = 0;
};

// The median (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> v);

// Ranks of `v` (1 = smallest), ties sharing their average rank.
std::vector<double> average_ranks(const std::vector<double>& v);

// Spearman's rank correlation of a and b. REQUIRES a.size() == b.size(). NaN when fewer than 2 values
// or when either side's ranks are all equal.
double spearman(const std::vector<double>& a, const std::vector<double>& b);

// REQUIRES every measured figure > 0 (else SchemaError naming the row).
FidelitySummary summarize_fidelity(const std::vector<FidelityRow>& rows);

}  // namespace zeroplan::sim
