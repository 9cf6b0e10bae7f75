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

TEST(ActivationOffloadWindow, ForwardHoldsOnlyTheNewestCopyByDefault) {
  // -1 and 0: a chosen tensor is copied out when the next is chosen, the copy before it then let go; so
  // each tensor is made beside the one waiting and the one in flight: 100 + 30 + 50.
  const std::vector<std::int64_t> b{100, 30, 50, 10};
  EXPECT_EQ(forward_window(b, -1), 180);
  EXPECT_EQ(forward_window(b, 0), 180);
  EXPECT_EQ(forward_window({10, 10, 10, 100, 10, 10}, 0), 120);  // 10 + 100 + 10 at most
  // A window of 1000 holds every copy until the forward ends: 100 + 30 + 50 + 10.
  EXPECT_EQ(forward_window(b, 1000), 190);
  EXPECT_EQ(forward_window({}, -1), 0);
  EXPECT_EQ(forward_window({70}, -1), 70);
}

TEST(ActivationOffloadWindow, BackwardHoldsTheTensorInUseAndThoseCopiedAhead) {
  // Needed last saved first: 10, 50, 30, 100.
  const std::vector<std::int64_t> b{100, 30, 50, 10};
  // -1: one ahead: 10 (+50 ahead), 50 (+30), 30 (+100), 100.
  EXPECT_EQ(backward_window(b, -1), 130);
  // 0: none ahead, each copied when unpacked: the largest.
  EXPECT_EQ(backward_window(b, 0), 100);
  // 60 ahead: 10 and 50 at the start; at 10: 50 ahead, 30 fits no more (80 > 60) -> 60; at 50: 30 -> 80;
  // at 30: 100 does not fit (and nothing is ahead: copied when unpacked) -> 30; at 100 -> 100.
  EXPECT_EQ(backward_window(b, 60), 100);
  EXPECT_EQ(backward_window({40, 40}, 1000), 80);  // everything back at once
  EXPECT_EQ(backward_window({}, -1), 0);
}

// resnet-tiny's stem as profiled at batch 4 (2026-11-27): BatchNorm's input, its mean and inverse std,
// the ReLU's output, MaxPool's indices; the backward unpacks the ReLU output and the indices (MaxPool),
// then BatchNorm's three, and peaks at BatchNorm's backward, after the other two were freed (the peaks
// are above the start, every saved tensor resident then). Offloaded, all five count from their copy
// back: the peak is BatchNorm's plus every byte that came back, 196,672 + 327,744, where the window
// (the most of them on the device at once, 196,608) added to the backward's peak undercounts.
TEST(OffloadedBackwardPeak, EveryByteCopiedBackCountsUntilTheMeasuredPeaksSubtractIt) {
  const std::vector<std::int64_t> sizes{131072, 32, 32, 131072, 65536};
  const std::vector<std::int64_t> order{3, 4, 0, 1, 2};
  const std::vector<std::int64_t> peaks{0, 0, 196608, -65536, -65536, 196672};
  const std::vector<bool> all(5, true), none(5, false);
  EXPECT_EQ(offloaded_backward_peak(sizes, all, order, peaks, -1), 196672 + 327744);
  EXPECT_EQ(offloaded_backward_peak(sizes, all, order, peaks, 0), 196672 + 327744);
  EXPECT_GT(offloaded_backward_peak(sizes, all, order, peaks, -1), 196672 + backward_window(sizes, -1));
  // Nothing offloaded: the measured peak.
  EXPECT_EQ(offloaded_backward_peak(sizes, none, order, peaks, -1), 196672);
  // Only MaxPool's indices: back at the start (the first needed in the reverse of the order saved) and
  // counted from there on, freed at MaxPool's backward (which the later peaks subtract): BatchNorm's peak
  // plus 65,536.
  const std::vector<bool> indices{false, false, false, false, true};
  EXPECT_EQ(offloaded_backward_peak(sizes, indices, order, peaks, -1), 196672 + 65536);
  // A peak before the first unpack, with a tensor copied ahead beside it.
  EXPECT_EQ(offloaded_backward_peak({100, 50}, {true, true}, {1, 0}, {500, 0, 0}, -1), 550);
  EXPECT_EQ(offloaded_backward_peak({100, 50}, {true, true}, {1, 0}, {500, 0, 0}, 0), 500);
}

}  // namespace
}  // namespace zeroplan
