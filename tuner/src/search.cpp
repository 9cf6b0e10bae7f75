// One candidate: bound, simulate, fit the activation offload ratio and the checkpointed units.
#include "zeroplan/tuner/search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "zeroplan/profiles/errors.h"
#include "zeroplan/sim/errors.h"

namespace zeroplan::tuner {
namespace {

constexpr int kRatioSteps = 100;  // 1 / kRatioStep
static_assert(kRatioSteps * kRatioStep > 0.999 && kRatioSteps * kRatioStep < 1.001);

double ratio_of(int steps) { return static_cast<double>(steps) / kRatioSteps; }

Plan with_ratio(Plan p, int steps) {
  p.offload.activations_ratio = ratio_of(steps);
  return p;
}

std::int64_t device_excess(const Prediction& p, const MemoryLimits& l) { return p.device.total_bytes() - l.device_bytes; }
std::int64_t host_excess(const Prediction& p, const MemoryLimits& l) { return p.host.total_bytes() - l.host_bytes; }

// Runs one candidate's variants and remembers the best fitting one and the closest miss.
class Fitter {
 public:
  Fitter(const Evaluator& ev, const MemoryLimits& limits, const SearchOptions& opt, Outcome& out)
      : ev_(ev), limits_(limits), opt_(opt), out_(out) {}

  // True when the bound proves `p` needs more device memory than the limit (recorded as a miss).
  bool device_ruled_out(const Plan& p) {
    if (!opt_.prune) return false;
    const std::int64_t ex = ev_.memory_lower_bound(p).device - limits_.device_bytes;
    if (ex <= 0) return false;
    ++out_.bound_prunes;
    note_bound_miss(p, ex, 0);
    return true;
  }
  // Same for host memory.
  bool host_ruled_out(const Plan& p) {
    if (!opt_.prune) return false;
    const std::int64_t ex = ev_.memory_lower_bound(p).host - limits_.host_bytes;
    if (ex <= 0) return false;
    ++out_.bound_prunes;
    note_bound_miss(p, 0, ex);
    return true;
  }
  bool ruled_out(const Plan& p) { return device_ruled_out(p) || host_ruled_out(p); }
  // True when the step-time bound proves `p` slower than the ranking's cutoff (SearchOptions).
  bool time_ruled_out(const Plan& p) {
    if (!opt_.prune || !(opt_.rank_cutoff_s < std::numeric_limits<double>::infinity())) return false;
    if (!(opt_.rank_cutoff_s < ev_.step_time_lower_bound(p))) return false;
    time_cut_ = true;
    return true;
  }

  // True when no activation offload ratio of `p` can be ranked: a ratio that fits is at least the smallest
  // whose device memory bound fits (the bound never rises with the ratio), so its step time is above that
  // ratio's step-time bound (which never falls with it); above the ranking's cutoff, none can be ranked.
  // REQUIRES: `p` at ratio 1 within the device memory bound.
  bool ratio_time_ruled_out(const Plan& p) {
    if (!opt_.prune || !(opt_.rank_cutoff_s < std::numeric_limits<double>::infinity())) return false;
    // The smallest ratio within the bound: `hi` is, `lo` is not (-1: none below).
    int lo = -1, hi = kRatioSteps;
    while (hi - lo > 1) {
      const int mid = lo + (hi - lo) / 2;
      (ev_.memory_lower_bound(with_ratio(p, mid)).device > limits_.device_bytes ? lo : hi) = mid;
    }
    if (!(opt_.rank_cutoff_s < ev_.step_time_lower_bound(with_ratio(p, hi)))) return false;
    time_cut_ = true;
    return true;
  }

  // Simulates; returns nullopt on a simulator error (recorded).
  std::optional<Prediction> sim(const Plan& p) {
    ++out_.simulations;
    try {
      Prediction pred = ev_.simulate(p);
      if (!fits(pred, limits_)) note_miss(p, pred);
      else if (!best_ || faster(pred, *best_)) {
        best_ = pred;
        best_plan_ = p;
      }
      return pred;
    } catch (const SchemaError& e) {  // the plan cannot be simulated: counted, not fatal
      if (error_.empty()) error_ = e.what();
      return std::nullopt;
    } catch (const sim::SimError& e) {
      if (error_.empty()) error_ = e.what();
      return std::nullopt;
    }
  }

  void finish(const Plan& candidate) {
    if (best_) {
      out_.status = Status::fits;
      out_.plan = *best_plan_;
      out_.prediction = std::move(*best_);
      out_.device_excess_bytes = out_.host_excess_bytes = 0;
    } else if (time_cut_) {  // what it had left could not be ranked
      out_.status = Status::dominated;
      out_.plan = candidate;
    } else if (miss_) {
      out_.status = Status::out_of_memory;
      out_.plan = *miss_plan_;
      out_.prediction = std::move(*miss_);
      out_.device_excess_bytes = std::max<std::int64_t>(0, device_excess(out_.prediction, limits_));
      out_.host_excess_bytes = std::max<std::int64_t>(0, host_excess(out_.prediction, limits_));
    } else if (bound_miss_plan_) {
      out_.status = Status::out_of_memory_bound;
      out_.plan = *bound_miss_plan_;
      out_.device_excess_bytes = bound_miss_device_;
      out_.host_excess_bytes = bound_miss_host_;
    } else {
      out_.status = Status::error;
      out_.error = error_;
    }
  }

 private:
  // Closest miss: the smallest total excess.
  void note_miss(const Plan& p, const Prediction& pred) {
    const std::int64_t ex = std::max<std::int64_t>(0, device_excess(pred, limits_)) +
                            std::max<std::int64_t>(0, host_excess(pred, limits_));
    if (!miss_ || ex < miss_excess_) {
      miss_ = pred;
      miss_plan_ = p;
      miss_excess_ = ex;
    }
  }
  void note_bound_miss(const Plan& p, std::int64_t device_ex, std::int64_t host_ex) {
    if (!bound_miss_plan_ || device_ex + host_ex < bound_miss_device_ + bound_miss_host_) {
      bound_miss_plan_ = p;
      bound_miss_device_ = device_ex;
      bound_miss_host_ = host_ex;
    }
  }

  const Evaluator& ev_;
  const MemoryLimits& limits_;
  const SearchOptions& opt_;
  Outcome& out_;
  std::optional<Prediction> best_, miss_;
  std::optional<Plan> best_plan_, miss_plan_, bound_miss_plan_;
  std::int64_t miss_excess_ = 0, bound_miss_device_ = 0, bound_miss_host_ = 0;
  std::string error_;
  bool time_cut_ = false;
};

// Smallest ratio (in grid steps) whose device memory fits, given that `lo` does not fit the device
// (excess `lo_excess` > 0) and `hi` does (excess `hi_excess` <= 0). Secant guesses, rounded up to the grid
// and kept strictly inside the bracket (else the midpoint): bisection's guarantee, and one or two
// simulations when memory falls linearly with the ratio. Host memory only grows with the ratio, so the
// smallest device-fitting ratio is also the candidate's best chance on the host; the Fitter keeps the
// variants that fit both.
void smallest_ratio(Fitter& f, const Plan& p, const MemoryLimits& limits, int lo, double lo_excess, int hi, double hi_excess) {
  int stalls = 0;  // steps in a row that did not halve the bracket
  while (hi - lo > 1) {
    const int width = hi - lo;
    int guess = lo + static_cast<int>(std::ceil(width * lo_excess / std::max(1.0, lo_excess - hi_excess)));
    if (stalls >= 2) guess = lo + width / 2;
    guess = std::clamp(guess, lo + 1, hi - 1);
    const Plan q = with_ratio(p, guess);
    if (f.device_ruled_out(q)) {
      lo = guess;  // lo_excess kept: an underestimate of the slope, fine for a guess
    } else {
      const auto pred = f.sim(q);
      if (!pred) return;
      const double ex = static_cast<double>(device_excess(*pred, limits));
      if (ex <= 0) {
        hi = guess;
        hi_excess = ex;
      } else {
        if (host_excess(*pred, limits) > 0) return;  // the device needs more, the host already has too much
        lo = guess;
        lo_excess = ex;
      }
    }
    stalls = 2 * (hi - lo) > width ? stalls + 1 : 0;
  }
}

}  // namespace

std::string_view to_string(Status s) {
  switch (s) {
    case Status::fits: return "fits";
    case Status::out_of_memory_bound: return "out_of_memory_bound";
    case Status::out_of_memory: return "out_of_memory";
    case Status::error: return "error";
    case Status::dominated: return "dominated";
  }
  return "?";
}

MemoryLimits memory_limits(const ClusterProfile& cluster, const TuneConstraints& c, int world_size) {
  MemoryLimits l;
  l.device_bytes = static_cast<std::int64_t>(static_cast<double>(cluster.device.mem_bytes) * (1.0 - c.device_headroom_fraction)) -
                   c.device_headroom_bytes;
  const std::int64_t ranks_per_node = std::max(1, std::min(cluster.devices_per_node, world_size));
  l.host_bytes = (static_cast<std::int64_t>(static_cast<double>(cluster.host.mem_bytes) * (1.0 - c.host_headroom_fraction)) -
                  c.host_headroom_bytes) /
                 ranks_per_node;
  return l;
}

bool fits(const Prediction& p, const MemoryLimits& l) {
  return p.device.total_bytes() <= l.device_bytes && p.host.total_bytes() <= l.host_bytes;
}

bool faster(const Prediction& a, const Prediction& b) {
  if (a.step_time_s != b.step_time_s) return a.step_time_s < b.step_time_s;
  if (a.device.total_bytes() != b.device.total_bytes()) return a.device.total_bytes() < b.device.total_bytes();
  return a.host.total_bytes() < b.host.total_bytes();
}

std::vector<Checkpointing> checkpointing_levels(const ModelProfile& model) {
  struct Entry {
    int index;
    double cost_per_byte;
    double freed_total;  // bytes freed over every repetition
  };
  std::vector<Entry> entries;
  const double ref = model.batch;
  for (int i = 0; i < static_cast<int>(model.units.size()); ++i) {
    const UnitProfile& u = model.units[static_cast<std::size_t>(i)];
    // Checkpointing keeps the unit's input (the previous unit's output) instead of what it saves.
    const double input = i > 0 ? model.units[static_cast<std::size_t>(i - 1)].bytes_output.at(ref, ref) : 0.0;
    const double freed = u.bytes_saved.at(ref, ref) - input;
    if (freed <= 0) continue;
    // Recompute cost: the measured forward time, or its FLOPs for analytic profiles (no times).
    const double t = u.time_fwd_s.at(ref, ref);
    entries.push_back({i, (t > 0 ? t : u.flops_fwd.at(ref, ref)) / freed, freed * u.count});
  }
  // A unit freeing under 1% of what checkpointing everything frees is not worth a level of its own.
  double total = 0;
  for (const Entry& e : entries) total += e.freed_total;
  std::erase_if(entries, [&](const Entry& e) { return e.freed_total < 0.01 * total; });
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.cost_per_byte < b.cost_per_byte; });
  std::vector<Checkpointing> levels(1);  // none
  std::vector<int> chosen;
  for (const Entry& e : entries) {
    chosen.push_back(e.index);
    Checkpointing c;
    c.mode = Checkpointing::Mode::units;
    c.units = chosen;
    std::sort(c.units.begin(), c.units.end());
    if (c.units.size() == model.units.size()) {
      c.mode = Checkpointing::Mode::all;
      c.units.clear();
    }
    levels.push_back(std::move(c));
  }
  return levels;
}

Outcome evaluate_candidate(const Candidate& cand, const ModelProfile& model, const Evaluator& ev, const MemoryLimits& limits,
                           const SearchOptions& opt) {
  Outcome out;
  Fitter f(ev, limits, opt, out);
  const std::vector<Checkpointing> levels =
      cand.fit_checkpointing ? checkpointing_levels(model) : std::vector<Checkpointing>{cand.plan.checkpointing};
  // What to do after a variant: try the next (more saving) one, stop (it fits: the next only add
  // recompute), or give up on this kind of variant (it cannot fit the host, or cannot be simulated).
  enum class Next { level, fits, stop };
  // One variant: simulated as is, or with the smallest activation offload ratio that fits.
  auto try_variant = [&](const Plan& p) {
    if (!cand.fit_activations) {
      if (f.host_ruled_out(p)) return Next::stop;  // checkpointing frees no host memory
      if (f.device_ruled_out(p)) return Next::level;
      const auto pred = f.sim(p);
      if (pred && fits(*pred, limits)) return Next::fits;
      if (pred && host_excess(*pred, limits) > 0) return Next::stop;
      return Next::level;
    }
    // Ratio free. Device memory falls and host memory grows with the ratio: ratio 1 is the device's
    // best chance, ratio 0 the host's.
    const Plan p0 = with_ratio(p, 0), p1 = with_ratio(p, kRatioSteps);
    if (f.host_ruled_out(p0)) return Next::stop;
    if (f.device_ruled_out(p1)) return Next::level;
    // No ratio that fits can be ranked (the next level, with more recompute, is checked as usual).
    if (f.ratio_time_ruled_out(p)) return Next::level;
    std::optional<Prediction> pred0;
    if (!f.device_ruled_out(p0)) {
      pred0 = f.sim(p0);
      if (!pred0) return Next::stop;
      if (fits(*pred0, limits)) return Next::fits;  // no offload needed
      if (host_excess(*pred0, limits) > 0) return Next::stop;
    }
    const auto pred1 = f.sim(p1);
    if (!pred1) return Next::stop;
    if (device_excess(*pred1, limits) > 0) return Next::level;
    // Excess at ratio 0: simulated, or the bound's (an underestimate: fine for a first guess).
    const double ex0 = pred0 ? static_cast<double>(device_excess(*pred0, limits))
                             : static_cast<double>(ev.memory_lower_bound(p0).device - limits.device_bytes);
    smallest_ratio(f, p, limits, 0, std::max(1.0, ex0), kRatioSteps, static_cast<double>(device_excess(*pred1, limits)));
    return Next::level;
  };
  bool offload_fits_host = true;  // checkpoint_offload variants: false once one overflows the host
  for (const Checkpointing& level : levels) {
    Plan p = cand.plan;
    p.checkpointing = level;
    const bool checkpoints = level.mode != Checkpointing::Mode::none;
    if (p.checkpoint_offload && !checkpoints) continue;  // nothing to offload
    // Checkpointed units add recompute (this level's and every later one's): above the ranking's cutoff,
    // none can be ranked. The candidate's own bound (no units checkpointed) was checked by the tune.
    if (cand.fit_checkpointing && checkpoints && f.time_ruled_out(p)) break;
    if (try_variant(p) != Next::level) break;
    // The kept inputs on the host before checkpointing more units (copies instead of recompute).
    if (cand.fit_checkpoint_offload && checkpoints && !p.checkpoint_offload && offload_fits_host) {
      p.checkpoint_offload = true;
      const Next n = try_variant(p);
      if (n == Next::fits) break;
      offload_fits_host = n != Next::stop;
    }
  }
  f.finish(cand.plan);
  return out;
}

}  // namespace zeroplan::tuner
