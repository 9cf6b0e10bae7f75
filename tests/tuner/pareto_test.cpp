#include "zeroplan/tuner/pareto.h"

#include <gtest/gtest.h>

namespace zeroplan::tuner {
namespace {

TEST(Pareto, KeepsOnlyUndominatedPointsLeastMemoryFirst) {
  // id: bytes, throughput
  std::vector<ParetoPoint> pts = {{0, 10, 5}, {1, 20, 4}, {2, 20, 9}, {3, 30, 9}, {4, 5, 1}, {5, 40, 12}, {6, 20, 9}};
  EXPECT_EQ(pareto_front(pts), (std::vector<int>{4, 0, 2, 5}));
}

TEST(Pareto, EmptyAndSingle) {
  EXPECT_TRUE(pareto_front({}).empty());
  EXPECT_EQ(pareto_front({{7, 1, 1}}), (std::vector<int>{7}));
}

}  // namespace
}  // namespace zeroplan::tuner
