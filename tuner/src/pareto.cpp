#include "zeroplan/tuner/pareto.h"

#include <algorithm>
#include <limits>

namespace zeroplan::tuner {

std::vector<int> pareto_front(std::vector<ParetoPoint> points) {
  std::sort(points.begin(), points.end(), [](const ParetoPoint& a, const ParetoPoint& b) {
    if (a.bytes != b.bytes) return a.bytes < b.bytes;
    if (a.throughput != b.throughput) return a.throughput > b.throughput;
    return a.id < b.id;
  });
  std::vector<int> front;
  double best = -std::numeric_limits<double>::infinity();
  for (const ParetoPoint& p : points) {
    if (p.throughput > best) {
      front.push_back(p.id);
      best = p.throughput;
    }
  }
  return front;
}

}  // namespace zeroplan::tuner
