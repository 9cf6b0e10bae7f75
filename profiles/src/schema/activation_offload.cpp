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

namespace {

// The executor's copies back in a unit's backward (ActivationOffload::issue_ahead and unpack): the picked
// tensors needed in the reverse of the order saved, copied back ahead of need while copy_back_ahead
// allows, or when unpacked if not yet; `copied` every byte copied back so far, `ahead` those not yet
// unpacked.
struct CopiesBack {
  CopiesBack(const std::vector<std::int64_t>& sizes, const std::vector<bool>& picked, std::int64_t prefetch_bytes)
      : sizes_(sizes), picked_(picked), prefetch_(prefetch_bytes), back_(sizes.size(), false),
        next_(static_cast<std::ptrdiff_t>(sizes.size()) - 1) {
    issue();
  }
  void unpack(std::size_t j) {
    if (!picked_[j]) return;
    if (back_[j]) {
      ahead -= sizes_[j];
    } else {
      back_[j] = true;
      copied += sizes_[j];
    }
    issue();
  }
  std::int64_t ahead = 0, copied = 0;

 private:
  void issue() {
    for (; next_ >= 0; --next_) {
      const auto j = static_cast<std::size_t>(next_);
      if (!picked_[j] || back_[j]) continue;
      if (!copy_back_ahead(ahead, sizes_[j], prefetch_)) break;
      back_[j] = true;
      ahead += sizes_[j];
      copied += sizes_[j];
    }
  }
  const std::vector<std::int64_t>& sizes_;
  const std::vector<bool>& picked_;
  std::int64_t prefetch_;
  std::vector<bool> back_;
  std::ptrdiff_t next_;
};

}  // namespace

std::int64_t backward_window(const std::vector<std::int64_t>& sizes, std::int64_t prefetch_bytes) {
  // Every tensor offloaded, unpacked in the reverse of the order saved: the one unpacked beside those ahead.
  const std::vector<bool> all(sizes.size(), true);
  CopiesBack back(sizes, all, prefetch_bytes);
  std::int64_t most = back.ahead;
  for (std::size_t k = sizes.size(); k-- > 0;) {
    back.unpack(k);
    most = std::max(most, sizes[k] + back.ahead);
  }
  return most;
}

std::int64_t offloaded_backward_peak(const std::vector<std::int64_t>& sizes, const std::vector<bool>& picked,
                                     const std::vector<std::int64_t>& order, const std::vector<std::int64_t>& peaks,
                                     std::int64_t prefetch_bytes) {
  CopiesBack back(sizes, picked, prefetch_bytes);
  std::int64_t most = peaks.empty() ? 0 : peaks[0] + back.copied;
  for (std::size_t k = 0; k < order.size() && k + 1 < peaks.size(); ++k) {
    const auto j = static_cast<std::size_t>(order[k]);
    if (j < sizes.size()) back.unpack(j);
    most = std::max(most, peaks[k + 1] + back.copied);
  }
  return most;
}

}  // namespace zeroplan
