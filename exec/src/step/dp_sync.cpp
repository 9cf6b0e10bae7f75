// Data-parallel gradient synchronisation:
//  0-1  gradients accumulate in one full flat buffer; on the last microbatch (DDP's no_sync before it)
//       buckets of all_reduce_bucket_bytes, in reverse unit order, are all-reduced as soon as their
//       first unit finished its backward;
//  2-3  each unit's gradient accumulates in a transient full buffer every microbatch. Stage 3
//       reduce-scatters it as soon as the unit finished its backward; stage 2 groups units in backward
//       order until buckets.reduce_buffer_elems (DeepSpeed's reduce_bucket_size): a unit's gradient is
//       copied into the bucket's buffer, rank-major, and freed, and the bucket is reduce-scattered after
//       its last unit (a bucket of one unit in place). This rank's share is added to its gradient shard
//       (on the host with offload.grads) once the next reduce-scatter was issued, and every reduction of
//       a microbatch lands before the next one starts (FSDP's end-of-backward callback).
// Gradients are in the param dtype; a collective in another dtype (reduce_dtype, fp32_reduce_scatter)
// runs on a cast copy (one bucket's at a time at stages 0-1), the result cast back (precision.cpp).
#include <algorithm>

#include "pieces.h"
#include "strformat.h"

namespace zeroplan::exec::pieces {

GradSync::GradSync(Ctx& c) : c_(c), reduce_scatter_(c.plan.zero_stage >= 2), stage_(c.plan.zero_stage) {
  c.at("all", "setup");
  grad_full_.resize(c.units.size());
  rs_comm_ = &c.comm;
  rs_tracker_ = &c.tracker;
  if (stage_ == 3) {
    try {
      rs_own_ = c.comm.duplicate();
      rs_comm_ = rs_own_.get();
      rs_own_tracker_ = std::make_unique<CommTracker>(c.rec, Lane::comm_rs);
      rs_tracker_ = rs_own_tracker_.get();
    } catch (const CommError&) {
      // A test communicator with one queue: reduce-scatters queue behind the gathers.
    }
  }
  if (reduce_scatter_) {
    transient_shard_ = !c.plan.offload.grads;
    if (c.plan.offload.grads) grad_shard_all_ = c.hzeros(c.shard_total, c.dt.grad);
    const std::int64_t cap = stage_ == 2 ? std::max<std::int64_t>(1, c.plan.buckets.reduce_buffer_elems) : 1;
    rs_bucket_of_.assign(c.units.size(), -1);
    rs_slot_of_.assign(c.units.size(), -1);
    RsBucket cur;
    for (int u = c.unit_count() - 1; u >= 0; --u) {
      const UnitRT& U = c.unit(u);
      if (U.numel() > 0) {
        rs_bucket_of_[static_cast<std::size_t>(u)] = static_cast<int>(rs_buckets_.size());
        rs_slot_of_[static_cast<std::size_t>(u)] = static_cast<int>(cur.units.size());
        cur.units.push_back(u);
        cur.offsets.push_back(cur.shard);
        cur.padded += U.layout.padded_numel();
        cur.shard += U.shard();
      }
      if ((cur.padded >= cap || u == 0) && !cur.units.empty()) {
        rs_buckets_.push_back(std::move(cur));
        cur = RsBucket{};
      }
    }
    if (c.plan.offload.grads) {
      std::int64_t max_shard = 0;
      for (const auto& b : rs_buckets_) max_shard = std::max(max_shard, b.shard);
      host_scratch_ = c.hzeros(max_shard, c.dt.reduce_scatter);
    }
    return;
  }
  all_reduce_comm_ = &c.comm;
  // OffloadModel: the accumulated gradients live on the host (its piece all-reduces slice by slice).
  grad_all_ = c.plan.offload_model.enabled ? c.hzeros(c.padded_total, c.dt.grad) : c.dzeros(c.padded_total, c.dt.grad);
  // Buckets in reverse unit order, closed once they reach the cap (DDP: bucket_cap_mb).
  const auto elem = static_cast<std::int64_t>(c10::elementSize(c.dt.grad));
  const std::int64_t cap = std::max<std::int64_t>(c.plan.buckets.all_reduce_bucket_bytes / elem, 1);
  Bucket cur;
  cur.hi = c.unit_count() - 1;
  for (int u = c.unit_count() - 1; u >= 0; --u) {
    const UnitRT& U = c.unit(u);
    cur.lo = u;
    cur.numel += U.layout.padded_numel();
    cur.offset = U.base;
    if (cur.numel >= cap || u == 0) {
      if (cur.numel > 0) buckets_.push_back(cur);
      cur = Bucket{};
      cur.hi = u - 1;
    }
  }
}

void GradSync::zero() {
  torch::NoGradGuard no_grad;
  c_.at("all", "zero_grad");
  const double t0 = c_.rec.now_s();
  if (grad_all_.defined()) grad_all_.zero_();
  if (transient_shard_) {
    grad_shard_all_ = torch::Tensor();
  } else if (grad_shard_all_.defined()) {
    grad_shard_all_.zero_();
  }
  c_.dev.wait_compute();
  c_.rec.span(Lane::compute, "zero_grad", t0, c_.rec.now_s(), "zero_grad");
}

torch::Tensor GradSync::region(int owner) {
  const UnitRT& U = c_.unit(owner);
  if (!reduce_scatter_) return grad_all_.narrow(0, U.base, U.layout.padded_numel());
  torch::Tensor& g = grad_full_[static_cast<std::size_t>(owner)];
  if (!g.defined()) g = c_.dzeros(U.layout.padded_numel(), c_.dt.grad);
  return g;
}

torch::Tensor GradSync::chunk(int u) {
  const UnitRT& U = c_.unit(u);
  if (stage_ <= 1) return grad_all_.narrow(0, U.base + U.shard_begin(c_.rank), U.shard());  // stage 0: all of it
  return shard().narrow(0, U.shard_base, U.shard());
}

torch::Tensor& GradSync::shard() {
  if (transient_shard_ && !grad_shard_all_.defined()) {
    grad_shard_all_ = c_.dempty(c_.shard_total, c_.dt.grad);
    shard_written_.assign(static_cast<std::size_t>(c_.unit_count()), 0);
  }
  return grad_shard_all_;
}

void GradSync::release() {
  if (transient_shard_) grad_shard_all_ = torch::Tensor();
}

void GradSync::after_bwd(int u, int micro, bool last_micro) {
  if (reduce_scatter_) {
    const int bi = rs_bucket_of_[static_cast<std::size_t>(u)];
    if (bi < 0) return;
    const RsBucket& b = rs_buckets_[static_cast<std::size_t>(bi)];
    torch::Tensor& g = grad_full_[static_cast<std::size_t>(u)];
    if (!g.defined()) g = region(u);  // a unit whose backward wrote nothing still reduces its zeros
    if (b.units.size() == 1) {
      launch_reduce_scatter(bi, g, micro);
      g = torch::Tensor();
    } else {
      torch::NoGradGuard no_grad;
      if (u == b.units.front()) bucket_buffer_ = c_.dempty(b.padded, c_.dt.grad);
      const std::int64_t offset = b.offsets[static_cast<std::size_t>(rs_slot_of_[static_cast<std::size_t>(u)])];
      const std::int64_t shard = c_.unit(u).shard();
      bucket_buffer_.view({c_.world, b.shard}).narrow(1, offset, shard).copy_(g.view({c_.world, shard}));
      g = torch::Tensor();
      if (u == b.units.back()) {
        launch_reduce_scatter(bi, bucket_buffer_, micro);
        bucket_buffer_ = torch::Tensor();
      }
    }
    return;
  }
  if (!last_micro || all_reduce_comm_ == nullptr) return;
  for (const Bucket& b : buckets_) {
    if (b.lo != u) continue;
    c_.cur_phase = "all_reduce";
    torch::Tensor view = grad_all_.narrow(0, b.offset, b.numel);
    const std::string name = detail::format("all_reduce units {}-{}", b.lo, b.hi);
    if (c_.dt.all_reduce == c_.dt.grad) {
      const double t = c_.rec.now_s();
      reduces_.push_back(
          c_.tracker.issue(all_reduce_comm_->all_reduce(view, ReduceOp::kSum), t, name, "all_reduce", u, micro));
      continue;
    }
    finish_cast_bucket();
    torch::Tensor wire = view.to(c_.dt.all_reduce);
    const double t = c_.rec.now_s();
    auto h = c_.tracker.issue(all_reduce_comm_->all_reduce(wire, ReduceOp::kSum), t, name, "all_reduce", u, micro);
    cast_buckets_.push_back({h, view, wire});
  }
}

void GradSync::finish_cast_bucket() {
  while (!cast_buckets_.empty()) {
    CastBucket& b = cast_buckets_.front();
    c_.tracker.wait(b.handle);
    b.view.copy_(b.wire);
    cast_buckets_.pop_front();
  }
}

void GradSync::launch_reduce_scatter(int bucket, torch::Tensor input, int micro) {
  // The previous reduce-scatter lands first: one in flight at a time (they queue on one communicator
  // anyway), and its buffers go before this one's are made, not after.
  drain(0);
  const RsBucket& b = rs_buckets_[static_cast<std::size_t>(bucket)];
  const int last = b.units.back();
  c_.cur_phase = "reduce_scatter";
  torch::Tensor source = std::move(input);
  torch::Tensor wire = c_.dt.reduce_scatter == c_.dt.grad ? source : source.to(c_.dt.reduce_scatter);
  if (wire.is_same(source)) source = torch::Tensor();
  torch::Tensor output = c_.dempty(b.shard, c_.dt.reduce_scatter);
  const double t = c_.rec.now_s();
  const std::string name = b.units.size() == 1
                               ? "reduce_scatter " + c_.unit(last).name
                               : detail::format("reduce_scatter units {}-{}", last, b.units.front());
  auto h = rs_tracker_->issue(rs_comm_->reduce_scatter(output, wire, ReduceOp::kSum), t, name, "reduce_scatter", last, micro);
  pending_.push_back({bucket, h, wire, output, source});
}

void GradSync::drain(std::size_t keep) {
  while (pending_.size() > keep) {
    PendingReduce p = std::move(pending_.front());
    pending_.pop_front();
    const RsBucket& b = rs_buckets_[static_cast<std::size_t>(p.bucket)];
    const UnitRT& L = c_.unit(b.units.back());
    c_.at(L.name, "reduce_scatter");
    rs_tracker_->wait(p.handle);
    p.input = torch::Tensor();
    torch::Tensor reduced = p.output;
    double t0 = 0;
    if (c_.plan.offload.grads) {
      t0 = c_.rec.now_s();
      reduced = host_scratch_.narrow(0, 0, b.shard);
      c_.dev.copy_d2h(reduced, p.output);
      c_.dev.wait_copies();
    }
    for (std::size_t k = 0; k < b.units.size(); ++k) {
      const UnitRT& U = c_.unit(b.units[k]);
      torch::Tensor mine = shard().narrow(0, U.shard_base, U.shard());
      const torch::Tensor landed = reduced.narrow(0, b.offsets[k], U.shard());
      const auto u = static_cast<std::size_t>(b.units[k]);
      if (transient_shard_ && shard_written_[u] == 0) {
        mine.copy_(landed);
        shard_written_[u] = 1;
      } else {
        mine.add_(landed);
      }
    }
    if (c_.plan.offload.grads) c_.rec.span(Lane::d2h, "d2h grads " + L.name, t0, c_.rec.now_s(), "d2h", b.units.back());
  }
}

torch::Tensor GradSync::sqr_norm_share() {
  torch::NoGradGuard no_grad;
  // A dot product: no temporary the size of the gradients (fairscale squares in the gradients' dtype too).
  if (reduce_scatter_) return torch::dot(shard(), shard()).to(torch::kFloat64);
  return torch::dot(grad_all_, grad_all_).to(torch::kFloat64) / static_cast<double>(c_.world);
}

void GradSync::finish_microbatch(std::size_t keep) {
  if (reduce_scatter_) drain(keep);
}

std::vector<int> GradSync::units_in_flight() const {
  std::vector<int> units;
  for (const PendingReduce& p : pending_) {
    const RsBucket& b = rs_buckets_[static_cast<std::size_t>(p.bucket)];
    units.insert(units.end(), b.units.begin(), b.units.end());
  }
  return units;
}

void GradSync::finish_step() {
  c_.cur_unit = "all";
  drain(0);
  c_.cur_phase = "all_reduce";
  for (auto& h : reduces_) c_.tracker.wait(h);
  reduces_.clear();
  finish_cast_bucket();
}

}  // namespace zeroplan::exec::pieces
