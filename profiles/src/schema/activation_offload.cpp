#include "zeroplan/profiles/activation_offload.h"

#include <algorithm>

namespace zeroplan {

bool OffloadPolicy::take(std::int64_t bytes) {
  if (bytes <= 0) return false;
  seen_ += bytes;
  // Within a relative 1e-12 of the ratio: the same answer for sizes scaled by the micro batch.
  if (static_cast<double>(sent_ + bytes) > ratio_ * static_cast<double>(seen_) * (1 + 1e-12)) return false;
  sent_ += bytes;
  return true;
}

std::vector<std::vector<bool>> offloaded_tensors(const std::vector<std::vector<std::int64_t>>& tensors,
                                                 const std::vector<bool>& keeps, double ratio) {
  OffloadPolicy policy(ratio);
  std::vector<std::vector<bool>> out(tensors.size());
  for (std::size_t u = 0; u < tensors.size(); ++u) {
    out[u].assign(tensors[u].size(), false);
    if (u < keeps.size() && !keeps[u]) continue;
    for (std::size_t i = 0; i < tensors[u].size(); ++i) out[u][i] = policy.take(tensors[u][i]);
  }
  return out;
}

std::int64_t prefetch_budget(std::int64_t prefetch_bytes, const std::vector<std::int64_t>& unit_bytes) {
  if (prefetch_bytes >= 0) return prefetch_bytes;
  return unit_bytes.empty() ? 0 : *std::max_element(unit_bytes.begin(), unit_bytes.end());
}

std::vector<int> prefetch_points(const std::vector<std::int64_t>& unit_bytes, std::int64_t budget) {
  const int n = static_cast<int>(unit_bytes.size());
  std::vector<int> at(unit_bytes.size(), -1);
  // Only the units that sent bytes take part (the others keep -1): a model of many units and no offload is
  // one pass, not units^2 (the simulator asks once per microbatch).
  std::vector<int> sent;
  for (int v = 0; v < n; ++v)
    if (unit_bytes[static_cast<std::size_t>(v)] > 0) sent.push_back(v);
  std::int64_t ahead = 0;  // bytes copied back for units whose backward has not started
  auto below = sent.rbegin();  // the first sent unit below w, walking down
  for (int w = n - 1; w >= 0; --w) {
    const auto wi = static_cast<std::size_t>(w);
    while (below != sent.rend() && *below >= w) ++below;
    if (unit_bytes[wi] > 0) {
      if (at[wi] < 0) at[wi] = w;
      else ahead -= unit_bytes[wi];
    }
    for (auto it = below; it != sent.rend(); ++it) {
      const auto vi = static_cast<std::size_t>(*it);
      if (at[vi] >= 0) continue;
      if (ahead + unit_bytes[vi] > budget) break;
      at[vi] = w;
      ahead += unit_bytes[vi];
    }
  }
  return at;
}

}  // namespace zeroplan
