// activation_offload.h: which saved tensors go to the host and when they come back.
#include "zeroplan/profiles/activation_offload.h"

#include <gtest/gtest.h>

namespace zeroplan {
namespace {

std::int64_t sent_bytes(const std::vector<std::vector<std::int64_t>>& t, const std::vector<std::vector<bool>>& picked) {
  std::int64_t s = 0;
  for (std::size_t u = 0; u < t.size(); ++u)
    for (std::size_t i = 0; i < t[u].size(); ++i) s += picked[u][i] ? t[u][i] : 0;
  return s;
}

TEST(ActivationOffloadPolicy, RatioZeroSendsNothingOneSendsEverything) {
  const std::vector<std::vector<std::int64_t>> t{{100, 50}, {100, 50, 25}};
  EXPECT_EQ(sent_bytes(t, offloaded_tensors(t, {true, true}, 0.0)), 0);
  EXPECT_EQ(sent_bytes(t, offloaded_tensors(t, {true, true}, 1.0)), 325);
}

TEST(ActivationOffloadPolicy, HalfAlternatesAndStaysWithinTheRatioOfWhatWasSeen) {
  // Equal tensors: the first stays (sending it would make the share 1 > 0.5), the second goes, ...
  const std::vector<std::vector<std::int64_t>> t{{10, 10, 10, 10}, {10, 10}};
  const auto p = offloaded_tensors(t, {true, true}, 0.5);
  EXPECT_EQ(p[0], (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(p[1], (std::vector<bool>{false, true}));
  // At every point the bytes sent are within the ratio of the bytes seen.
  OffloadPolicy policy(0.25);
  std::int64_t seen = 0, sent = 0;
  for (std::int64_t b : {7, 300, 12, 12, 90, 1, 64, 64, 64, 5}) {
    seen += b;
    if (policy.take(b)) sent += b;
    EXPECT_LE(sent, 0.25 * static_cast<double>(seen) + 1e-9);
  }
  EXPECT_GT(sent, 0);
}

TEST(ActivationOffloadPolicy, CheckpointedUnitsSendNothingAndDoNotCount) {
  const std::vector<std::vector<std::int64_t>> t{{10, 10}, {1000, 1000}, {10, 10}};
  const auto with = offloaded_tensors(t, {true, false, true}, 0.5);
  EXPECT_EQ(with[1], (std::vector<bool>{false, false}));
  // Unit 2 decides as if unit 1 were not there.
  const auto without = offloaded_tensors({{10, 10}, {}, {10, 10}}, {true, true, true}, 0.5);
  EXPECT_EQ(with[0], without[0]);
  EXPECT_EQ(with[2], without[2]);
}

TEST(ActivationOffloadPolicy, ScalingEveryTensorKeepsThePicks) {
  // The simulator decides on the profile's sizes at its reference batch, the executor on the run's:
  // sizes proportional to the batch give the same picks.
  const std::vector<std::vector<std::int64_t>> ref{{3, 7, 11, 2}, {5, 5, 13}, {17}};
  for (double ratio : {0.1, 0.25, 0.5, 0.75}) {
    std::vector<std::vector<std::int64_t>> big = ref;
    for (auto& u : big)
      for (auto& b : u) b *= 24;
    EXPECT_EQ(offloaded_tensors(ref, {true, true, true}, ratio), offloaded_tensors(big, {true, true, true}, ratio)) << ratio;
  }
}

TEST(ActivationOffloadPrefetch, OneUnitAheadByDefault) {
  // Budget -1: the most one unit sends (100): before unit 3's backward, 3 and 2; before 2's, 1; ...
  const std::vector<std::int64_t> b{100, 100, 100, 100};
  EXPECT_EQ(prefetch_budget(-1, b), 100);
  EXPECT_EQ(prefetch_points(b, prefetch_budget(-1, b)), (std::vector<int>{1, 2, 3, 3}));
}

TEST(ActivationOffloadPrefetch, ZeroBudgetCopiesEachUnitWhenItsBackwardStarts) {
  const std::vector<std::int64_t> b{100, 0, 40, 100};
  EXPECT_EQ(prefetch_points(b, 0), (std::vector<int>{0, -1, 2, 3}));
}

TEST(ActivationOffloadPrefetch, ABudgetOfEverythingCopiesAllAtTheStart) {
  const std::vector<std::int64_t> b{10, 20, 0, 30};
  EXPECT_EQ(prefetch_points(b, 1000), (std::vector<int>{3, 3, -1, 3}));
  // A budget of 25 ahead: 20 before unit 3's backward (30 is unit 3's own), 10 more does not fit; 10 at
  // unit 1's once 20 left the account.
  EXPECT_EQ(prefetch_points(b, 25), (std::vector<int>{1, 3, -1, 3}));
}

}  // namespace
}  // namespace zeroplan
