#include "zeroplan/sim/fidelity.h"

#include <gtest/gtest.h>

#include <cmath>

#include "zeroplan/profiles/errors.h"

namespace zeroplan::sim {
namespace {

TEST(Fidelity, AverageRanksShareTies) {
  EXPECT_EQ(average_ranks({3, 1, 2}), (std::vector<double>{3, 1, 2}));
  EXPECT_EQ(average_ranks({5, 1, 5, 0}), (std::vector<double>{3.5, 2, 3.5, 1}));
}

TEST(Fidelity, SpearmanKnownValues) {
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
  // Monotone but not linear: ranks agree exactly.
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4, 5}, {1, 4, 9, 16, 1000}), 1.0);
  // One swap among 5: rho = 1 - 6 * 2 / (5 * 24) = 0.9.
  EXPECT_NEAR(spearman({1, 2, 3, 4, 5}, {1, 2, 4, 3, 5}), 0.9, 1e-12);
  // Ties: Pearson on average ranks ({1.5,1.5,3} vs {1,2,3}) = sqrt(3)/2.
  EXPECT_NEAR(spearman({7, 7, 9}, {1, 2, 3}), std::sqrt(3.0) / 2, 1e-12);
}

TEST(Fidelity, SpearmanUndefined) {
  EXPECT_TRUE(std::isnan(spearman({1}, {1})));
  EXPECT_TRUE(std::isnan(spearman({2, 2, 2}, {1, 2, 3})));
  EXPECT_TRUE(std::isnan(spearman({1, 2}, {1, 2, 3})));
}

TEST(Fidelity, SummaryMediansMaximaAndRanks) {
  std::vector<FidelityRow> rows = {
      {"a", 1.10, 1.00, 100, 100},  // time +10%, memory 0
      {"b", 1.80, 2.00, 190, 200},  // time -10%, memory -5%
      {"c", 3.30, 3.00, 330, 300},  // time +10%, memory +10%
      {"d", 3.20, 4.00, 400, 400},  // time -20%, memory 0
  };
  const FidelitySummary s = summarize_fidelity(rows);
  EXPECT_EQ(s.plans, 4);
  EXPECT_NEAR(s.time.median_abs_error, 0.10, 1e-12);
  EXPECT_NEAR(s.time.max_abs_error, 0.20, 1e-12);
  EXPECT_EQ(s.time.max_label, "d");
  EXPECT_NEAR(s.memory.median_abs_error, 0.025, 1e-12);
  EXPECT_NEAR(s.memory.max_abs_error, 0.10, 1e-12);
  EXPECT_EQ(s.memory.max_label, "c");
  // Predicted time ranks c > d: one swap among 4 -> 1 - 6 * 2 / (4 * 15) = 0.8.
  EXPECT_NEAR(s.time_spearman, 0.8, 1e-12);
  EXPECT_NEAR(s.memory_spearman, 1.0, 1e-12);
}

TEST(Fidelity, RejectsAMissingMeasurement) {
  try {
    summarize_fidelity({{"stage 3", 1, 0, 1, 1}});
    FAIL() << "expected SchemaError";
  } catch (const SchemaError& e) {
    EXPECT_STREQ(e.what(), "fidelity: row 'stage 3' has measured step time 0 s and peak 1 bytes; both must be > 0");
  }
}

}  // namespace
}  // namespace zeroplan::sim
