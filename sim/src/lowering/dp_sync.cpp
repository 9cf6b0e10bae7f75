// Gradient synchronisation per zero stage:
//  0-1  bucketed all-reduce (all_reduce_bucket_bytes) fired in backward order, only in the last
//       microbatch (no_sync accumulation); LocalSGD reduces within the node only;
//  2    reduce-scatter of reduce_buffer_elems buckets every microbatch (fairscale SDP); the unsharded
//       gradients of a bucket are transient, this rank's share stays in its resident shard;
//  3    reduce-scatter of each unit's padded flat gradient every microbatch, on its own stream.
// 16-bit reduce of fp32 grads, fp32_reduce_scatter and Gloo's full-size reduce-scatter temporary are
// transient buffers of the collective. With an offloaded optimizer the owned share is copied to the host.
// At stages 2-3 at most two reduce-scatters are in flight (as FSDP2 waits for the previous one): the
// backward that opens a bucket (stage 3: a unit) waits for the reduce-scatter issued two before, so
// unsharded gradients cannot pile up behind a slow network.
#include <algorithm>

#include "context.h"
#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim::lowering {

namespace {

TaskId collective(Ctx& c, ResourceId res, CollOp op, std::int64_t elems, int ranks, NameId name, int u, int mb,
                  TaskId after) {
  const std::int64_t bytes = elems * (c.plan.precision.fp32_reduce_scatter ? 4 : c.b.reduce);
  CollectiveOptions o;
  o.algo = c.opt.collective_algo;
  const TaskId t = c.g.add_task(res, collective_time(c.cluster, op, static_cast<double>(bytes), ranks, o),
                                c.label(name, u, mb), {after}, c.n_cat_comm);
  // A cast copy when the collective's dtype differs from the gradients'.
  if (bytes != elems * c.b.grad) c.g.alloc(t, c.dev, bytes, MemCategory::buffers, c.label(c.n_bucket, u, mb));
  if (op == CollOp::reduce_scatter) {
    const std::int64_t temp = reduce_scatter_temp_bytes(c.cluster, bytes);
    if (temp > 0) c.g.alloc(t, c.dev, temp, MemCategory::buffers, c.label(c.n_temp, u, mb));
  }
  return t;
}

// Offloaded optimizer: the owned share of a final gradient goes to the host.
TaskId to_host(Ctx& c, std::int64_t elems, int u, int mb, TaskId after) {
  if (!c.plan.offload.optimizer || elems <= 0) return after;
  const std::int64_t bytes = elems * c.b.grad;
  const TaskId t = c.g.add_task(c.d2h, copy_time(c.cluster, CopyDir::d2h, static_cast<double>(bytes)),
                                c.label(c.n_d2h, u, mb), {after}, c.n_cat_copy);
  // Without offloaded grads the host copy is a staging buffer the host optimizer consumes.
  if (!c.plan.offload.grads) c.g.alloc(t, c.host, bytes, MemCategory::grads, c.label(c.n_grads, u, mb), kNone);
  return t;
}

}  // namespace

void GradSync::after_bwd(int u, int mb, TaskId bwd) {
  const Unit& x = c_.units[static_cast<std::size_t>(u)];
  const bool last_mb = mb + 1 == c_.m;
  if (c_.plan.zero_stage >= 2) {
    // A borrower's backward writes into its owners' gradients: allocated here, not at the owner's.
    if (early_.empty()) early_.assign(c_.units.size(), kNone);
    for (const int o : x.owners_due) {
      const Unit& owner = c_.units[static_cast<std::size_t>(o)];
      const std::int64_t elems = c_.plan.zero_stage == 2 ? std::max<std::int64_t>(0, owner.params - owner.shard) : owner.padded;
      early_[static_cast<std::size_t>(o)] = c_.g.alloc(bwd, c_.dev, elems * c_.b.grad, MemCategory::grads,
                                                       c_.label(c_.n_full_grads, o, mb), kNone);
    }
  }
  // This unit's own full gradient: allocated early by a borrower, or now.
  auto full_grad = [&](std::int64_t elems) {
    if (!early_.empty() && early_[static_cast<std::size_t>(u)] != kNone) {
      const AllocId a = early_[static_cast<std::size_t>(u)];
      early_[static_cast<std::size_t>(u)] = kNone;
      return a;
    }
    return c_.g.alloc(bwd, c_.dev, elems * c_.b.grad, MemCategory::grads, c_.label(c_.n_full_grads, u, mb), kNone);
  };
  switch (c_.plan.zero_stage) {
    case 0:
    case 1: {
      if (!last_mb) return;  // no_sync: accumulate locally
      bucket_elems_ += x.params;
      bucket_last_ = bwd;
      const std::int64_t cap = std::max<std::int64_t>(1, c_.plan.buckets.all_reduce_bucket_bytes / c_.b.grad);
      if (bucket_elems_ >= cap) flush(mb);
      return;
    }
    case 2: {
      // Unsharded gradients of the unit beyond this rank's share, until the bucket is reduced.
      const std::int64_t transient = std::max<std::int64_t>(0, x.params - x.shard);
      if (bucket_elems_ == 0 && reduces_.size() >= 2) c_.g.add_dep(bwd, reduces_[reduces_.size() - 2]);
      bucket_allocs_.push_back(full_grad(transient));
      bucket_elems_ += x.params;
      bucket_last_ = bwd;
      if (bucket_elems_ >= c_.plan.buckets.reduce_buffer_elems) flush(mb);
      return;
    }
    default: {
      if (reduces_.size() >= 2) c_.g.add_dep(bwd, reduces_[reduces_.size() - 2]);
      const AllocId full = full_grad(x.padded);
      const TaskId rs = collective(c_, c_.comm_rs, CollOp::reduce_scatter, x.padded, c_.n, c_.n_reduce_scatter, u, mb, bwd);
      c_.g.set_free_at(full, rs);
      reduces_.push_back(rs);
      if (last_mb) done.push_back({to_host(c_, x.shard, u, mb, rs), x.shard});
      return;
    }
  }
}

void GradSync::flush(int mb) {
  if (bucket_elems_ == 0) return;
  const int stage = c_.plan.zero_stage;
  TaskId t;
  std::int64_t owned;
  if (stage <= 1) {
    const int ranks = c_.plan.localsgd() ? std::min(c_.n, c_.cluster.devices_per_node) : c_.n;
    t = collective(c_, c_.comm, CollOp::all_reduce, bucket_elems_, ranks, c_.n_all_reduce, -1, mb, bucket_last_);
    owned = stage == 0 ? bucket_elems_ : (bucket_elems_ + c_.n - 1) / c_.n;
  } else {
    t = collective(c_, c_.comm, CollOp::reduce_scatter, bucket_elems_, c_.n, c_.n_reduce_scatter, -1, mb, bucket_last_);
    for (AllocId a : bucket_allocs_) c_.g.set_free_at(a, t);
    reduces_.push_back(t);
    owned = (bucket_elems_ + c_.n - 1) / c_.n;
  }
  if (mb + 1 == c_.m) done.push_back({stage == 0 ? t : to_host(c_, owned, -1, mb, t), owned});
  bucket_elems_ = 0;
  bucket_last_ = kNone;
  bucket_allocs_.clear();
}

void GradSync::finish_microbatch(int mb) { flush(mb); }

}  // namespace zeroplan::sim::lowering
