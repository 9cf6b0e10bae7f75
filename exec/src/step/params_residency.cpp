// Parameter residency. Stages 0-2: every unit's parameters are views of one full flat buffer, always
// resident. Stage 3 (FSDP): this rank's shard of every unit lives in one shard buffer (on the host with
// offload.params); a unit's full buffer is all-gathered before its forward and its backward (the
// buckets.prefetch_depth units that run next prefetched), and freed after use (after forward only with reshard_after_forward and unless
// pinned: unit 0, FSDP's root, and owners of borrowed weights). All of them in the param dtype.
// OffloadModel: the full flat buffer lives on the host; a unit's device buffer is filled while its slice
// visits the device (offload_model.cpp).
#include "pieces.h"

namespace zeroplan::exec::pieces {

ParamResidency::ParamResidency(Ctx& c) : c_(c), sharded_(c.plan.zero_stage == 3) {
  torch::NoGradGuard no_grad;
  // Floating buffers (BatchNorm's running statistics) in the parameters' dtype, as module.to(dtype) and
  // the profiler make them: a 16-bit BatchNorm takes its statistics in its own dtype.
  for (auto& U : c.units) {
    for (auto& b : U.module->buffers()) {
      if (b.is_floating_point() && b.scalar_type() != c.dt.param) b.set_data(b.to(c.dt.param));
    }
  }
  const auto n = static_cast<std::size_t>(c.unit_count());
  gathered_.assign(n, 1);
  gathers_.resize(n);
  gather_src_.resize(n);
  if (c.plan.offload_model.enabled) {  // OffloadModel: the host holds them; slices visit the device
    on_host_ = true;
    flat_all_ = c.hzeros(c.padded_total, c.dt.param);
    for (std::size_t u = 0; u < n; ++u) {
      UnitRT& U = c.units[u];
      c.cur_unit = U.name;
      U.full = c.dzeros(U.layout.padded_numel(), c.dt.param);
      U.flat.copy_into(U.full);
      U.flat.bind(U.full);
      flat_all_.narrow(0, U.base, U.layout.padded_numel()).copy_(U.full);
      if (U.numel() > 0) {
        free_storage(U.full);
        gathered_[u] = 0;
      }
    }
    return;
  }
  if (!sharded_) {
    flat_all_ = c.dzeros(c.padded_total, c.dt.param);
    for (auto& U : c.units) {
      c.cur_unit = U.name;
      U.full = flat_all_.narrow(0, U.base, U.layout.padded_numel());
      U.flat.copy_into(U.full);
      U.flat.bind(U.full);
    }
    return;
  }
  shard_all_ = c.plan.offload.params ? c.hzeros(c.shard_total, c.dt.param) : c.dzeros(c.shard_total, c.dt.param);
  for (std::size_t u = 0; u < n; ++u) {
    UnitRT& U = c.units[u];
    c.cur_unit = U.name;
    U.full = c.dzeros(U.layout.padded_numel(), c.dt.param);
    U.flat.copy_into(U.full);
    U.flat.bind(U.full);
    shard_all_.narrow(0, U.shard_base, U.shard()).copy_(U.full.narrow(0, U.layout.shard_begin(c.rank), U.shard()));
    if (U.numel() > 0) {
      free_storage(U.full);
      gathered_[u] = 0;
    }
  }
}

torch::Tensor ParamResidency::chunk(int u) {
  const UnitRT& U = c_.unit(u);
  if (sharded_) return shard_all_.narrow(0, U.shard_base, U.shard());
  return flat_all_.narrow(0, U.base + U.shard_begin(c_.rank), U.shard());
}

void ParamResidency::gather(int u, int micro) {
  UnitRT& U = c_.unit(u);
  const auto i = static_cast<std::size_t>(u);
  if (gathered_[i] || gathers_[i] || U.numel() == 0) return;
  realloc_storage(U.full);
  torch::Tensor src = shard_all_.narrow(0, U.shard_base, U.shard());
  if (c_.plan.offload.params) {
    // The offloaded shard comes back straight into this rank's chunk of the full buffer, and the
    // all-gather runs in place: no device copy of the shard besides.
    const double t0 = c_.rec.now_s();
    torch::Tensor mine = U.full.narrow(0, U.layout.shard_begin(c_.rank), U.shard());
    c_.dev.copy_h2d(mine, src);
    c_.dev.wait_copies();
    c_.rec.span(Lane::h2d, "h2d params " + U.name, t0, c_.rec.now_s(), "h2d", u, micro);
    src = mine;
  }
  gather_src_[i] = src;
  const double t = c_.rec.now_s();
  torch::Tensor out = U.full;
  gathers_[i] = c_.tracker.issue(c_.comm.all_gather(out, src), t, "all_gather " + U.name, "all_gather", u, micro);
}

void ParamResidency::ensure(int u, int micro) {
  const auto i = static_cast<std::size_t>(u);
  if (gathered_[i] || c_.unit(u).numel() == 0) return;
  gather(u, micro);
  c_.tracker.wait(gathers_[i]);
  gathers_[i].reset();
  gather_src_[i] = torch::Tensor();
  gathered_[i] = 1;
}

void ParamResidency::release(int u) {
  UnitRT& U = c_.unit(u);
  const auto i = static_cast<std::size_t>(u);
  if (!gathered_[i] || U.numel() == 0) return;
  free_storage(U.full);
  gathered_[i] = 0;
}

void ParamResidency::before_fwd(int u, int micro) {
  if (!sharded_) return;
  ensure(u, micro);
  for (const auto& b : c_.unit(u).borrows) ensure(b.owner, micro);
  // Prefetch: the next prefetch_depth units' all-gathers go out now (FSDP2: one).
  const int depth = c_.plan.prefetch_ahead();
  for (int k = 1; k <= depth && u + k < c_.unit_count(); ++k) gather(u + k, micro);
}

void ParamResidency::after_fwd(int u) {
  if (sharded_ && c_.plan.reshard_after_forward && !c_.unit(u).pinned) release(u);
}

void ParamResidency::before_bwd(int u, int micro) {
  if (!sharded_) return;
  ensure(u, micro);
  for (const auto& b : c_.unit(u).borrows) ensure(b.owner, micro);
  const int depth = c_.plan.prefetch_ahead();
  for (int k = 1; k <= depth && u - k >= 0; ++k) gather(u - k, micro);
}

void ParamResidency::after_bwd(int u) {
  if (sharded_) release(u);
}

std::vector<std::pair<std::string, torch::Tensor>> ParamResidency::full_copy() {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  torch::NoGradGuard no_grad;
  for (int u = 0; u < c_.unit_count(); ++u) {
    const UnitRT& U = c_.unit(u);
    c_.at(U.name, "gather_parameters");
    const bool was = gathered_[static_cast<std::size_t>(u)] != 0;
    if (on_host_ && !was) {  // OffloadModel: the host's copy, in the parameters' shapes
      for (const auto& s : U.flat.slots())
        out.emplace_back(U.name + "." + s.name, flat_all_.narrow(0, U.base + s.offset, s.numel).view(s.shape).clone());
      continue;
    }
    if (sharded_) ensure(u, -1);
    for (const auto& s : U.flat.slots()) out.emplace_back(U.name + "." + s.name, s.param.detach().clone());
    if (sharded_ && !was) release(u);
  }
  return out;
}

bool ParamResidency::views_valid() const {
  for (std::size_t u = 0; u < c_.units.size(); ++u) {
    const UnitRT& U = c_.units[u];
    if (U.numel() == 0) continue;
    if ((sharded_ || on_host_) && !gathered_[u]) {
      for (const auto& s : U.flat.slots()) {
        if (!s.param.storage().is_alias_of(U.full.storage())) return false;
      }
      continue;
    }
    if (!U.flat.views_valid(U.full)) return false;
  }
  return true;
}

}  // namespace zeroplan::exec::pieces
