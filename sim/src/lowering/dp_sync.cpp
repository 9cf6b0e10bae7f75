// Gradient synchronisation per zero stage:
//  0-1  bucketed all-reduce (all_reduce_bucket_bytes) fired in backward order, only in the last
//       microbatch (no_sync accumulation); LocalSGD reduces within the node only;
//  2    every microbatch, units grouped in backward order until reduce_buffer_elems (DeepSpeed's
//       reduce_bucket_size, fairscale's reduce_buffer_size): a unit's unsharded gradient is copied into
//       the bucket buffer (allocated when the bucket's first unit finished its backward) and freed, and
//       the bucket is reduce-scattered after its last unit; a bucket of one unit is reduce-scattered in
//       place;
//  3    reduce-scatter of each unit's padded flat gradient every microbatch.
// Stages 2-3 drain a reduce-scatter on the compute stream once the next one is issued (the executor
// waits for it there and adds its output to the gradient shard): its input, Gloo's full-size temporary
// and its output live until then, and the backward after the drain waits for it (at most two in flight,
// as FSDP2). 16-bit reduce of fp32 grads and fp32_reduce_scatter cast into a transient buffer of the
// collective. With an offloaded optimizer the owned share is copied to the host.
#include <algorithm>
#include <cmath>
#include <limits>

#include "context.h"
#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim::lowering {

namespace {

TaskId collective(Ctx& c, ResourceId res, CollOp op, std::int64_t elems, int ranks, NameId name, int u, int mb,
                  TaskId after, HeldAllocs* held = nullptr, double* known_s = nullptr) {
  const std::int64_t bytes = elems * (c.plan.precision.fp32_reduce_scatter ? 4 : c.b.reduce);
  // `known_s`: the time of this same collective asked before (NaN: not yet), kept by the caller.
  double s = known_s != nullptr ? *known_s : std::numeric_limits<double>::quiet_NaN();
  if (std::isnan(s)) {
    const std::string_view dtype = c.plan.precision.fp32_reduce_scatter ? std::string_view("fp32") : c.plan.precision.reduce_dtype;
    s = c.collective_s(op, static_cast<double>(bytes), ranks, c.opt.collective_algo, dtype);
    if (known_s != nullptr) *known_s = s;
  }
  const TaskId t = c.g.add_task(res, s, c.label(name, u, mb), {after}, c.n_cat_comm);
  // A cast copy when the collective's dtype differs from the gradients': a reduce-scatter's is held with
  // its input until the wait (the executor's GradSync keeps the wire of a pending reduce-scatter).
  if (bytes != elems * c.b.grad) {
    const AllocId a = c.g.alloc(t, c.dev, bytes, MemCategory::buffers, c.label(c.n_bucket, u, mb));
    if (op == CollOp::reduce_scatter && held != nullptr) held->push_back(a);
  }
  if (op == CollOp::reduce_scatter) {
    const std::int64_t temp = reduce_scatter_temp_bytes(c.cluster, bytes, ranks);
    if (temp > 0) {
      const AllocId a = c.g.alloc(t, c.dev, temp, MemCategory::buffers, c.label(c.n_temp, u, mb));
      if (held != nullptr) held->push_back(a);
    }
  }
  return t;
}

// Offloaded optimizer: the owned share of a final gradient goes to the host.
TaskId to_host(Ctx& c, std::int64_t elems, int u, int mb, TaskId after) {
  if (!c.plan.offload.optimizer || elems <= 0) return after;
  const std::int64_t bytes = elems * c.b.grad;
  const TaskId t = c.g.add_task(c.d2h, copy_time(c.cluster, CopyDir::d2h, static_cast<double>(bytes)),
                                c.label(c.n_d2h, u, mb), {after}, c.n_cat_copy);
  // It lands in the host gradient block that model_state_residency places for the whole step.
  return t;
}

}  // namespace

TaskId zero_grads(Ctx& c) {
  // The executor's GradSync::zero at the step's start: the full flat gradient at stages 0-1 (on the
  // host under OffloadModel), this rank's shards at stages 2-3 (on the host with offload.grads). A
  // memset: the bytes written at the memory bandwidth where they live.
  const bool sharded = c.plan.zero_stage >= 2;
  std::int64_t elems = 0;
  for (const Unit& u : c.units) elems += sharded ? u.shard : u.padded;
  const bool host = sharded ? c.plan.offload.grads : c.plan.offload_model.enabled;
  const double bw = host ? c.cluster.host.memcpy_bw_bytes_per_s : c.cluster.device.mem_bw_bytes_per_s;
  if (elems <= 0 || !(bw > 0)) return kNone;
  const double s = static_cast<double>(elems * c.b.grad) / bw + c.cluster.device.launch_overhead_s;
  return c.compute_task(s, c.n_zero_grad, -1, -1);
}

std::vector<RsBucket> reduce_scatter_buckets(const Plan& plan, const std::vector<Unit>& units,
                                             std::vector<int>* bucket_of) {
  const std::int64_t cap = plan.zero_stage == 2 ? std::max<std::int64_t>(1, plan.buckets.reduce_buffer_elems) : 1;
  std::vector<RsBucket> buckets;
  if (bucket_of != nullptr) bucket_of->assign(units.size(), -1);
  RsBucket cur;
  for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u) {
    const Unit& x = units[static_cast<std::size_t>(u)];
    if (bucket_of != nullptr) (*bucket_of)[static_cast<std::size_t>(u)] = static_cast<int>(buckets.size());
    if (x.params > 0) {
      cur.padded += x.padded;
      cur.shard += x.shard;
      ++cur.with_params;
      if (cur.first < 0) cur.first = u;
      cur.last = u;
    }
    if (cur.padded >= cap || u == 0) {
      buckets.push_back(cur);
      cur = RsBucket{};
    }
  }
  return buckets;
}

GradSync::GradSync(Ctx& c) : c_(c) {
  const Residency r = model_state_residency(c.plan, c.cluster, c.units);
  if (r.dev_grads_transient) shard_bytes_ = r.dev_grads;
}

void GradSync::plan_buckets() {
  early_.assign(c_.units.size(), kNone);
  rs_s_.assign(c_.units.size(), std::numeric_limits<double>::quiet_NaN());
  rs_buckets_ = reduce_scatter_buckets(c_.plan, c_.units, &bucket_of_);
}

TaskId GradSync::reduce_scatter(std::int64_t padded, std::int64_t shard, int u, int mb, TaskId bwd, AllocId input) {
  // The previous reduce-scatter lands first (the executor's GradSync: one in flight, its buffers freed
  // before this one's are made).
  const TaskId waited = drain(0, mb);
  InFlight f;
  f.allocs.push_back(input);
  // A unit's own reduce-scatter is the same in every microbatch.
  double* known = u >= 0 ? &rs_s_[static_cast<std::size_t>(u)] : nullptr;
  f.rs = collective(c_, c_.comm_rs, CollOp::reduce_scatter, padded, c_.n, c_.n_reduce_scatter, u, mb, bwd, &f.allocs, known);
  if (waited != kNone) c_.g.add_dep(f.rs, waited);
  // The output shard is in the collective's dtype (fp32 under reduce_dtype fp32 or fp32_reduce_scatter).
  const std::int64_t wire = c_.plan.precision.fp32_reduce_scatter ? 4 : c_.b.reduce;
  f.output = c_.g.alloc(f.rs, c_.dev, shard * wire, MemCategory::buffers, c_.label(c_.n_rs_output, u, mb), kNone);
  for (const AllocId a : f.allocs) c_.g.set_free_at(a, kNone);  // until drained
  reduces_.push_back(f.rs);
  in_flight_.push_back(std::move(f));
  return reduces_.back();
}

TaskId GradSync::drain(std::size_t keep, int mb) {
  TaskId wait = kNone;
  while (in_flight_.size() > keep) {
    const InFlight f = std::move(in_flight_.front());
    in_flight_.erase(in_flight_.begin());
    wait = c_.compute_task(0, c_.n_rs_wait, -1, mb);
    c_.g.add_dep(wait, f.rs);
    for (const AllocId a : f.allocs) c_.g.set_free_at(a, wait);
    // Then the output is added into the gradient shard, which the first one makes (the executor's
    // GradSync::drain: the input and the collective's copies go at the wait, the output after the add).
    const TaskId add = c_.compute_task(0, c_.n_rs_add, -1, mb);
    c_.g.add_dep(add, wait);
    c_.g.set_free_at(f.output, add);
    if (shard_bytes_ > 0 && shard_ == kNone) {
      shard_ = c_.g.alloc(add, c_.dev, shard_bytes_, MemCategory::grads, c_.label(c_.n_grads), kNone);
    }
    wait = add;
  }
  return wait;
}

TaskId GradSync::after_bwd(int u, int mb, TaskId bwd) {
  const Unit& x = c_.units[static_cast<std::size_t>(u)];
  const bool last_mb = mb + 1 == c_.m;
  if (c_.plan.zero_stage <= 1) {
    if (!last_mb) return bwd;  // no_sync: accumulate locally
    bucket_elems_ += x.params;
    bucket_last_ = bwd;
    const std::int64_t cap = std::max<std::int64_t>(1, c_.plan.buckets.all_reduce_bucket_bytes / c_.b.grad);
    if (bucket_elems_ >= cap) flush(mb);
    return bwd;
  }
  if (bucket_of_.empty()) plan_buckets();
  // A borrower's backward writes into its owners' gradients: allocated here, not at the owner's.
  for (const int o : x.owners_due) {
    const Unit& owner = c_.units[static_cast<std::size_t>(o)];
    early_[static_cast<std::size_t>(o)] = c_.g.alloc(bwd, c_.dev, owner.padded * c_.b.grad, MemCategory::grads,
                                                     c_.label(c_.n_full_grads, o, mb), kNone);
  }
  if (x.params == 0) return bwd;
  // This unit's own unsharded gradient: allocated early by a borrower, or by its backward.
  AllocId full = early_[static_cast<std::size_t>(u)];
  early_[static_cast<std::size_t>(u)] = kNone;
  if (full == kNone) {
    // The executor allocates it once autograd has returned (the unit's workspace and saved activations
    // gone) and adds autograd's gradients into it: beside it are those gradients, the unit's input and
    // output and both their gradients.
    const auto i = static_cast<std::size_t>(u);
    const std::int64_t in = i > 0 ? c_.units[i - 1].output : 0;
    const DeviceSpec& d = c_.cluster.device;
    // Read both, write one; a profile whose backward times include that add (backward_adds_grads)
    // leaves the zero-filled allocation (one write).
    const double add = (c_.model.backward_adds_grads ? 1.0 : 3.0) * static_cast<double>(x.params * c_.b.grad);
    const TaskId acc = c_.compute_task(d.mem_bw_bytes_per_s > 0 ? add / d.mem_bw_bytes_per_s : 0.0, c_.n_grad_acc, u, mb);
    c_.g.add_dep(acc, bwd);
    full = c_.g.alloc(acc, c_.dev, x.padded * c_.b.grad, MemCategory::grads, c_.label(c_.n_full_grads, u, mb), kNone);
    c_.g.alloc(acc, c_.dev, x.params * c_.b.grad + 2 * (in + x.output), MemCategory::activations,
               c_.label(c_.n_workspace, u, mb));
    bwd = acc;
  }
  const RsBucket& b = rs_buckets_[static_cast<std::size_t>(bucket_of_[static_cast<std::size_t>(u)])];
  if (b.with_params == 1) {
    const TaskId rs = reduce_scatter(x.padded, x.shard, u, mb, bwd, full);
    if (last_mb) done.push_back({to_host(c_, x.shard, u, mb, rs), x.shard});
    return bwd;
  }
  // After the backward (its activations freed), the gradient is copied into the bucket and freed.
  const DeviceSpec& d = c_.cluster.device;
  const double bytes = 2.0 * static_cast<double>(x.padded * c_.b.grad);  // read and write
  const TaskId copy = c_.compute_task((d.mem_bw_bytes_per_s > 0 ? bytes / d.mem_bw_bytes_per_s : 0.0) + d.launch_overhead_s,
                                      c_.n_bucket, u, mb);
  c_.g.add_dep(copy, bwd);
  if (u == b.first) {
    bucket_buffer_ = c_.g.alloc(copy, c_.dev, b.padded * c_.b.grad, MemCategory::buffers, c_.label(c_.n_bucket, u, mb), kNone);
  }
  c_.g.set_free_at(full, copy);
  if (u != b.last) return bwd;
  const TaskId rs = reduce_scatter(b.padded, b.shard, -1, mb, copy, bucket_buffer_);
  bucket_buffer_ = kNone;
  if (last_mb) done.push_back({to_host(c_, b.shard, -1, mb, rs), b.shard});
  return bwd;
}

// Stages 0-1: all-reduce the bucket collected so far.
void GradSync::flush(int mb) {
  if (bucket_elems_ == 0) return;
  const int ranks = c_.plan.localsgd() ? std::min(c_.n, c_.cluster.devices_per_node) : c_.n;
  const TaskId t = collective(c_, c_.comm, CollOp::all_reduce, bucket_elems_, ranks, c_.n_all_reduce, -1, mb, bucket_last_);
  const std::int64_t owned = c_.plan.zero_stage == 0 ? bucket_elems_ : (bucket_elems_ + c_.n - 1) / c_.n;
  if (mb + 1 == c_.m) done.push_back({c_.plan.zero_stage == 0 ? t : to_host(c_, owned, -1, mb, t), owned});
  bucket_elems_ = 0;
  bucket_last_ = kNone;
}

void GradSync::finish_microbatch(int mb) {
  flush(mb);
  drain(mb + 1 == c_.m && c_.plan.steps_beside_last_reduce_scatter() ? 1 : 0, mb);
}

}  // namespace zeroplan::sim::lowering
