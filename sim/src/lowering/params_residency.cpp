// Parameter residency at stage 3 (FSDP): all-gather a unit's flat parameter before its forward and (when
// resharded) again before its backward, free it after use, prefetch the next buckets.prefetch_depth units; offloaded shards are
// copied into their chunk of the full buffer first. The last unit's backward follows its forward at once, so it is kept; the first unit
// (the root's own parameters, FSDP's root is never resharded after forward) and every owner of shared
// parameters (its borrowers use them in between) stay gathered from forward to backward.
// Below stage 3 parameters are resident and nothing is scheduled here.
#include <cmath>
#include <limits>

#include "context.h"
#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim::lowering {

// How many units before the one gathered its gather waits for: 1 without prefetch (right before use), else
// one more than the prefetch depth.
int ParamResidency::back_distance() const {
  return c_.plan.prefetch_ahead() + 1;
}

TaskId ParamResidency::gather(int u, int mb, TaskId after) {
  const auto i = static_cast<std::size_t>(u);
  const Unit& x = c_.units[i];
  const auto bytes = x.padded * c_.b.param;
  // The unit's copy and gather take the same time in every microbatch and phase: found once.
  if (std::isnan(gather_s_[i])) {
    h2d_s_[i] = copy_time(c_.cluster, CopyDir::h2d, static_cast<double>(x.shard * c_.b.param));
    gather_s_[i] = c_.collective_s(CollOp::all_gather, static_cast<double>(bytes), c_.n, c_.opt.collective_algo);
  }
  TaskId ready = after;
  if (c_.plan.offload.params) {
    // The offloaded shard is copied into its chunk of the full buffer and the all-gather runs in place,
    // so the copy adds no device memory of its own; the full buffer is counted from the all-gather on,
    // as without offload.
    ready = c_.g.add_task(c_.h2d, h2d_s_[i], c_.label(c_.n_h2d, u, mb), {after}, c_.n_cat_copy);
  }
  const TaskId ag = c_.g.add_task(c_.comm, gather_s_[i], c_.label(c_.n_allgather, u, mb), {ready}, c_.n_cat_comm);
  gathered_alloc_[static_cast<std::size_t>(u)] =
      c_.g.alloc(ag, c_.dev, bytes, MemCategory::params, c_.label(c_.n_gathered, u, mb), kNone);
  last_gather = ag;
  return ag;
}

TaskId ParamResidency::before_fwd(int u, int mb) {
  if (c_.plan.zero_stage != 3) return kNone;
  if (gathered_.empty()) {
    gathered_.assign(c_.units.size(), kNone);
    gathered_alloc_.assign(c_.units.size(), kNone);
    h2d_s_.assign(c_.units.size(), std::numeric_limits<double>::quiet_NaN());
    gather_s_.assign(c_.units.size(), std::numeric_limits<double>::quiet_NaN());
  }
  // Prefetch (depth d, buckets.prefetch_depth): the gather of u is issued as the forward of u-d starts, so
  // it may run during the forwards of u-d..u-1 (it waits for u-d-1's); else after u-1's. The first units'
  // gathers wait for the end of the previous microbatch (the executor issues them as this microbatch's
  // forward starts), not for nothing.
  const int back = back_distance();
  if (u == 0) mb_start_ = mb > 0 ? c_.last_compute : kNone;
  const TaskId after = u - back >= 0 ? c_.fwd[static_cast<std::size_t>(u - back)] : mb_start_;
  return gathered_[static_cast<std::size_t>(u)] = gather(u, mb, after);
}

void ParamResidency::after_fwd(int u, int mb, TaskId fwd) {
  (void)mb;
  if (c_.plan.zero_stage != 3) return;
  // Kept as the executor keeps them: unit 0 (FSDP's root) and owners of borrowed weights; the last unit
  // is resharded too and gathered again for its backward (after the loss).
  const bool keep = stays_gathered(c_.units, static_cast<std::size_t>(u));
  if (c_.plan.reshard_after_forward && !keep) {
    c_.g.set_free_at(gathered_alloc_[static_cast<std::size_t>(u)], fwd);
    gathered_[static_cast<std::size_t>(u)] = kNone;
  }
}

TaskId ParamResidency::before_bwd(int u, int mb) {
  if (c_.plan.zero_stage != 3) return kNone;
  if (gathered_[static_cast<std::size_t>(u)] != kNone) return kNone;  // still gathered since the forward
  const int back = back_distance();
  const auto units = static_cast<int>(c_.units.size());
  // The unit before the last is prefetched as the last unit's backward starts (FSDP's BACKWARD_PRE, the
  // executor): after the last forward and its loss, not during them.
  const TaskId after = u + back < units ? c_.bwd[static_cast<std::size_t>(u + back)] : c_.fwd[static_cast<std::size_t>(units - 1)];
  return gather(u, mb, after);
}

void ParamResidency::after_bwd(int u, int mb, TaskId bwd) {
  (void)mb;
  if (c_.plan.zero_stage != 3) return;
  c_.g.set_free_at(gathered_alloc_[static_cast<std::size_t>(u)], bwd);
  gathered_[static_cast<std::size_t>(u)] = kNone;
}

}  // namespace zeroplan::sim::lowering
