// The Pareto front of memory against throughput.
#pragma once

#include <cstdint>
#include <vector>

namespace zeroplan::tuner {

struct ParetoPoint {
  int id = -1;
  std::int64_t bytes = 0;   // less is better
  double throughput = 0;    // more is better
};

// Ids of the points no other point beats: least bytes first, throughput strictly rising along the
// front. Among equal bytes the highest throughput (then the smallest id) stands for them.
std::vector<int> pareto_front(std::vector<ParetoPoint> points);

}  // namespace zeroplan::tuner
