#include "zeroplan/profiles/activation_offload.h"

#include <algorithm>
#include <deque>

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

std::int64_t forward_window(const std::vector<std::int64_t>& sizes, std::int64_t prefetch_bytes) {
  // As the executor: a chosen tensor waits (pending) until the next is chosen, then is copied out; the
  // older copies in flight go while more than the window is in flight.
  std::deque<std::int64_t> in_flight;
  std::int64_t held = 0, pending = 0, most = 0;
  bool has_pending = false;
  for (std::int64_t b : sizes) {
    most = std::max(most, held + pending + b);  // the new tensor is made beside them
    if (has_pending) {
      in_flight.push_back(pending);
      held += pending;
      while (let_oldest_go(in_flight.size(), held, prefetch_bytes)) {
        held -= in_flight.front();
        in_flight.pop_front();
      }
    }
    pending = b;
    has_pending = true;
  }
  return most;
}

std::int64_t backward_window(const std::vector<std::int64_t>& sizes, std::int64_t prefetch_bytes) {
  // Needed in the reverse of the order saved; `next` the next to copy back, `ahead` the bytes copied
  // back and not yet unpacked.
  const auto n = static_cast<std::ptrdiff_t>(sizes.size());
  std::ptrdiff_t next = n - 1;
  std::int64_t ahead = 0, most = 0;
  auto issue = [&] {
    while (next >= 0) {
      const std::int64_t b = sizes[static_cast<std::size_t>(next)];
      if (!copy_back_ahead(ahead, b, prefetch_bytes)) break;
      ahead += b;
      --next;
    }
  };
  issue();
  most = ahead;
  for (std::ptrdiff_t k = n - 1; k >= 0; --k) {
    const std::int64_t b = sizes[static_cast<std::size_t>(k)];
    if (k > next) ahead -= b;  // copied ahead
    else next = k - 1;         // copied now
    issue();
    most = std::max(most, b + ahead);
  }
  return most;
}

std::int64_t offloaded_backward_peak(const std::vector<std::int64_t>& sizes, const std::vector<bool>& picked,
                                     const std::vector<std::int64_t>& order, const std::vector<std::int64_t>& peaks,
                                     std::int64_t prefetch_bytes) {
  const std::size_t n = sizes.size();
  std::vector<bool> back(n, false);
  std::ptrdiff_t next = static_cast<std::ptrdiff_t>(n) - 1;
  std::int64_t ahead = 0, copied = 0;
  auto issue = [&] {  // ActivationOffload::issue_ahead
    while (next >= 0) {
      const auto j = static_cast<std::size_t>(next);
      if (!picked[j] || back[j]) {
        --next;
        continue;
      }
      if (!copy_back_ahead(ahead, sizes[j], prefetch_bytes)) break;
      back[j] = true;
      ahead += sizes[j];
      copied += sizes[j];
      --next;
    }
  };
  issue();
  std::int64_t most = peaks.empty() ? 0 : peaks[0] + copied;
  for (std::size_t k = 0; k < order.size() && k + 1 < peaks.size(); ++k) {
    const auto j = static_cast<std::size_t>(order[k]);
    if (j < n && picked[j]) {
      if (back[j]) {
        ahead -= sizes[j];  // copied ahead
      } else {
        back[j] = true;  // copied now
        copied += sizes[j];
      }
      issue();
    }
    most = std::max(most, peaks[k + 1] + copied);
  }
  return most;
}

}  // namespace zeroplan
