// Pipeline stage balance: the min-max contiguous partition of the units' weights.
#include <algorithm>
#include <cmath>
#include <utility>

#include "zeroplan/profiles/pipeline.h"

namespace zeroplan {
namespace {

// Fewest blocks whose sums stay <= cap (each block >= 1 item); parts + 1 when a single item exceeds it.
int blocks_needed(const std::vector<double>& w, double cap, int parts) {
  int blocks = 1;
  double sum = 0;
  for (const double x : w) {
    if (x > cap) return parts + 1;
    if (sum + x > cap) {
      ++blocks;
      sum = 0;
    }
    sum += x;
  }
  return blocks;
}

}  // namespace

std::vector<int> balanced_blocks(const std::vector<double>& w, int parts) {
  const int n = static_cast<int>(w.size());
  double lo = 0, hi = 0;
  for (const double x : w) {
    lo = std::max(lo, x);
    hi += x;
  }
  // Bisect the cap until the bracket is within a relative 1e-12 (about 40 rounds).
  for (int i = 0; i < 200 && hi - lo > 1e-12 * std::max(1.0, hi); ++i) {
    const double mid = 0.5 * (lo + hi);
    (blocks_needed(w, mid, parts) <= parts ? hi : lo) = mid;
  }
  // Fill front to back under the cap, closing a block early when the items left are just enough for
  // one per remaining block.
  std::vector<int> out;
  double sum = 0;
  int count = 0;
  for (int i = 0; i < n; ++i) {
    const int left_after = n - i;  // items from i on
    const int blocks_left = parts - static_cast<int>(out.size());
    if (count > 0 && (sum + w[static_cast<std::size_t>(i)] > hi || left_after < blocks_left)) {
      out.push_back(count);
      sum = 0;
      count = 0;
    }
    sum += w[static_cast<std::size_t>(i)];
    ++count;
  }
  out.push_back(count);
  // Fewer blocks than parts (the cap fits everything in fewer): split the last blocks one item at a time.
  while (static_cast<int>(out.size()) < parts) {
    auto it = std::find_if(out.rbegin(), out.rend(), [](int c) { return c > 1; });
    --*it;
    out.insert(it.base(), 1);
  }
  return out;
}

std::vector<PipelineOp> pipeline_order(const std::string& schedule, int p, int s, int m) {
  std::vector<PipelineOp> ops;
  if (schedule == "gpipe") {
    for (int j = 0; j < m; ++j) ops.push_back({true, j});
    for (int j = 0; j < m; ++j) ops.push_back({false, j});
    return ops;
  }
  const int warmup = std::min(p - s - 1, m);
  for (int j = 0; j < warmup; ++j) ops.push_back({true, j});
  for (int i = 0; i < m - warmup; ++i) {
    ops.push_back({true, warmup + i});
    ops.push_back({false, i});
  }
  for (int j = m - warmup; j < m; ++j) ops.push_back({false, j});
  return ops;
}

bool pipeline_checkpointed(const Plan& plan, int mb) {
  const std::string& mode = plan.pipeline.checkpoint;
  return plan.pipeline_stages > 1 && (mode == "always" || (mode == "except_last" && mb + 1 < plan.microbatches));
}

std::vector<int> pipeline_balance(const Plan& plan, const ModelProfile& model) {
  const PipelineBalance& b = plan.pipeline.balance;
  if (b.mode == PipelineBalance::Mode::units) return b.units;
  const double batch = plan.micro_batch, ref = model.batch;
  double total_time = 0, total_flops = 0;
  for (const UnitProfile& u : model.units) {
    total_time += u.time_fwd_s.at(batch, ref) + u.time_bwd_s.at(batch, ref);
    total_flops += u.flops_fwd.at(batch, ref) + u.flops_bwd.at(batch, ref);
  }
  std::vector<double> w;
  w.reserve(static_cast<std::size_t>(model.expanded_unit_count()));
  for (const UnitProfile& u : model.units) {
    double x = 1;
    if (b.mode == PipelineBalance::Mode::memory)
      x = 2.0 * static_cast<double>(u.bytes_param) + std::max(0.0, u.bytes_saved.at(batch, ref));
    else if (total_time > 0)
      x = u.time_fwd_s.at(batch, ref) + u.time_bwd_s.at(batch, ref);
    else if (total_flops > 0)
      x = u.flops_fwd.at(batch, ref) + u.flops_bwd.at(batch, ref);
    w.insert(w.end(), static_cast<std::size_t>(u.count), std::max(0.0, x));
  }
  return balanced_blocks(w, plan.pipeline_stages);
}

std::vector<int> offload_model_slice_starts(const std::vector<std::int64_t>& unit_params, int slices) {
  const int n = static_cast<int>(unit_params.size());
  std::int64_t total = 0;
  for (std::int64_t p : unit_params) total += p;
  total = std::max<std::int64_t>(1, total);
  std::vector<int> starts{0};
  std::int64_t cum = 0;
  for (int u = 0; u < n && static_cast<int>(starts.size()) < slices; ++u) {
    cum += unit_params[static_cast<std::size_t>(u)];
    const int s = static_cast<int>(starts.size());
    const bool reached = cum * slices >= total * s;
    const bool must = n - (u + 1) == slices - s;  // exactly one unit left per remaining slice
    if ((reached || must) && u + 1 < n) starts.push_back(u + 1);
  }
  starts.push_back(n);
  return starts;
}

std::vector<std::vector<int>> offload_model_slice_members(const std::vector<int>& starts,
                                                          const std::vector<std::vector<int>>& borrow_owners) {
  std::vector<std::vector<int>> members;
  for (std::size_t s = 0; s + 1 < starts.size(); ++s) {
    std::vector<int> out;
    for (int u = starts[s]; u < starts[s + 1]; ++u) out.push_back(u);
    for (int u = starts[s]; u < starts[s + 1]; ++u) {
      for (const int o : borrow_owners[static_cast<std::size_t>(u)]) {
        if (o < starts[s] && std::find(out.begin(), out.end(), o) == out.end()) out.push_back(o);
      }
    }
    members.push_back(std::move(out));
  }
  return members;
}

std::vector<std::vector<int>> allgather_buckets(const std::vector<std::int64_t>& gathered_bytes,
                                                std::int64_t bucket_bytes) {
  std::vector<std::vector<int>> buckets;
  std::int64_t held = 0;
  for (int u = 0; u < static_cast<int>(gathered_bytes.size()); ++u) {
    const std::int64_t b = gathered_bytes[static_cast<std::size_t>(u)];
    if (b <= 0) continue;
    if (buckets.empty() || held + b > bucket_bytes) {
      buckets.emplace_back();
      held = 0;
    }
    buckets.back().push_back(u);
    held += b;
  }
  return buckets;
}

}  // namespace zeroplan
