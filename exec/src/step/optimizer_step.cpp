// The optimizer step on this rank's flat shard (PyTorch's fused kernels, optimizer.h):
//  stage 0       every parameter, on the device;
//  stages 1-3    this rank's shard; stages 1-2 then all-gather every rank's updated chunks, units
//                bucketed by buckets.allgather_bucket_bytes (allgather_buckets; in fp16 with broadcast_fp16);
//  offload.optimizer: master shard (or the offloaded stage-3 shard itself), gradients and state on the
//                host, where the step runs; the updated master comes back to the device.
// Stage 3 with offloaded parameters and a device optimizer steps a device copy of the shard.
// OffloadModel (stage 0): parameters, gradients and state on the host, stepped there in place.
// With 16-bit parameters and master_fp32 the master is an fp32 shard (on the host with offload.optimizer)
// stepped unit by unit from an fp32 copy of that unit's gradient, then rounded into the 16-bit parameters.
// Before the step the loss scale is taken out of the gradients; a step with non-finite gradients on some
// rank is skipped on every rank, touching neither parameters nor optimizer state.
#include <algorithm>
#include <cmath>
#include <functional>

#include "pieces.h"

namespace zeroplan::exec::pieces {

OptimizerStep::OptimizerStep(Ctx& c, ParamResidency& params, GradSync& grads, Precision& precision)
    : c_(c), params_(params), grads_(grads), precision_(precision), stage_(c.plan.zero_stage) {
  torch::NoGradGuard no_grad;
  c.at("all", "setup");
  // Stage 3: the master shard is the parameter shard itself unless it lives on the device while the
  // optimizer runs on the host, or the parameters are 16-bit beside an fp32 master.
  const bool params_on_host = params.on_host() || (stage_ == 3 && c.plan.offload.params);
  separate_master_ = c.dt.master || (c.host_optimizer() && !params_on_host);
  if (c.dt.master) {
    master_ = std::move(c.master_init);  // fp32, where the optimizer runs
  } else if (separate_master_) {
    master_ = c.hzeros(c.shard_total, c.dt.param);
    for (int u = 0; u < c.unit_count(); ++u) {
      master_.narrow(0, c.unit(u).shard_base, c.unit(u).shard()).copy_(params.chunk(u));
    }
  }
  // A host copy of the gradients to step with, unless they are on the host already (offloaded stage 2-3
  // gradients, OffloadModel's).
  if (c.host_optimizer() && !params.on_host() && (stage_ == 1 || !c.plan.offload.grads))
    host_grad_ = c.hzeros(c.shard_total, c.dt.grad);

  std::vector<std::int64_t> segments;
  if (stage_ == 0) {
    segments.push_back(c.padded_total);
  } else if (stage_ == 3 || c.host_optimizer() || separate_master_) {
    segments.push_back(c.shard_total);
  } else {
    for (const auto& U : c.units) segments.push_back(U.shard());
  }
  const torch::ScalarType state = c.dt.state;
  std::function<torch::Tensor(std::int64_t)> alloc = [&c, state](std::int64_t n) {
    return c.host_optimizer() ? c.hzeros(n, state) : c.dzeros(n, state);
  };
  optimizer_ = std::make_unique<FlatOptimizer>(c.plan.optimizer, segments, alloc);
  if (stage_ == 1 || stage_ == 2) {  // the all-gather buckets of sync_params, fixed for the run
    std::vector<std::int64_t> gathered(static_cast<std::size_t>(c.unit_count()), 0);
    for (int u = 0; u < c.unit_count(); ++u) {
      const UnitRT& U = c.unit(u);
      if (U.numel() > 0) gathered[static_cast<std::size_t>(u)] = U.layout.padded_numel() * c10::elementSize(c.dt.param_sync);
    }
    gather_buckets_ = allgather_buckets(gathered, c.plan.buckets.allgather_bucket_bytes);
  }
  stepped_ = stage_ == 0 ? c.padded_total : c.shard_total;
  TORCH_INTERNAL_ASSERT(!steps_beside_last_reduce_scatter() || (!separate_master_ && !c.host_optimizer() && !c.dt.master));
}

// Stage 3: the units whose reduce-scatters have landed are stepped while the last one (the first unit's,
// issued at the end of the backward) is in flight; then it is waited and its units stepped. The fused
// kernels are elementwise, so the parameters and state are those of one step over the whole shard.
void OptimizerStep::step_beside_last_reduce_scatter(double lr_scale) {
  const std::vector<int> in_flight = grads_.units_in_flight();
  auto step_unit = [&](int u) {
    const UnitRT& U = c_.unit(u);
    if (U.shard() == 0) return;
    optimizer_->step_range(0, U.shard_base, params_.flat().narrow(0, U.shard_base, U.shard()),
                           grads_.shard().narrow(0, U.shard_base, U.shard()), lr_scale);
  };
  c_.at("all", "optimizer");
  double t0 = c_.rec.now_s();
  optimizer_->begin_step();
  for (int u = c_.unit_count() - 1; u >= 0; --u) {
    if (std::find(in_flight.begin(), in_flight.end(), u) == in_flight.end()) step_unit(u);
  }
  c_.dev.wait_compute();
  c_.rec.span(Lane::compute, "optimizer", t0, c_.rec.now_s(), "optimizer");
  grads_.finish_step();
  c_.at("all", "optimizer");
  t0 = c_.rec.now_s();
  for (const int u : in_flight) step_unit(u);
  c_.dev.wait_compute();
  c_.rec.span(Lane::compute, "optimizer", t0, c_.rec.now_s(), "optimizer");
  grads_.release();
}

void OptimizerStep::gradients_home() {
  if (!host_grad_.defined()) return;
  const double t0 = c_.rec.now_s();
  for (int u = 0; u < c_.unit_count(); ++u) {
    const UnitRT& U = c_.unit(u);
    c_.dev.copy_d2h(host_grad_.narrow(0, U.shard_base, U.shard()), grads_.chunk(u));
  }
  c_.dev.wait_copies();
  c_.rec.span(Lane::d2h, "d2h grads", t0, c_.rec.now_s(), "d2h");
}

torch::Tensor OptimizerStep::grad_of(int u) {
  const UnitRT& U = c_.unit(u);
  if (host_grad_.defined()) return host_grad_.narrow(0, U.shard_base, U.shard());
  if (stage_ == 0) return grads_.chunk(u);  // all of the unit (OffloadModel: on the host)
  if (c_.host_optimizer()) return grads_.shard().narrow(0, U.shard_base, U.shard());
  return grads_.chunk(u);
}

// torch.nn.utils.clip_grad_norm_'s rule (DeepSpeed's gradient_clipping): factor min(1, max / (norm + 1e-6)).
// The norm is over the model's every gradient once: a rank holding its data-parallel group's full gradient
// (stage 0, all-reduced, identical on every member) counts 1/world of its squares, a rank holding a shard
// all of them; the squares are summed over every rank (all pipeline stages).
double OptimizerStep::clip_factor(const std::vector<torch::Tensor>& grads, double scale) {
  const double max_norm = c_.plan.optimizer.max_grad_norm;
  if (!(max_norm > 0)) return 1.0;
  double squares = 0;
  for (const torch::Tensor& g : grads) {
    if (g.numel() == 0) continue;
    const double n = at::linalg_vector_norm(g, 2, {}, false, torch::kFloat32).item<double>();
    squares += n * n;
  }
  if (stage_ == 0 && c_.world > 1) squares /= c_.world;
  Communicator* comm = c_.world_comm != nullptr ? c_.world_comm : &c_.comm;
  if (comm->world_size() > 1) {
    torch::Tensor t = torch::full({1}, squares, torch::TensorOptions().dtype(torch::kFloat64).device(c_.dev.torch_device()));
    comm->all_reduce(t, ReduceOp::kSum)->wait();
    squares = t.item<double>();
  }
  const double norm = std::sqrt(squares) * scale;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

bool OptimizerStep::step(double lr_scale) {
  torch::NoGradGuard no_grad;
  c_.at("all", "optimizer");
  if (steps_beside_last_reduce_scatter()) {
    step_beside_last_reduce_scatter(lr_scale);
    return true;
  }
  gradients_home();
  if (c_.dt.master) return step_master_by_unit(lr_scale);
  const bool offloaded_params = stage_ == 3 && c_.plan.offload.params;
  std::vector<torch::Tensor> params, grads;
  if (stage_ == 0) {
    params.push_back(params_.flat());
    grads.push_back(grads_.full());
  } else if (c_.host_optimizer()) {
    params.push_back(separate_master_ ? master_ : params_.flat());
    grads.push_back(host_grad_.defined() ? host_grad_ : grads_.shard());
  } else if (offloaded_params) {
    // Parameters on the host, optimizer on the device: step a device copy of the shard.
    torch::Tensor p = c_.dempty(c_.shard_total, c_.dt.param);
    const double t0 = c_.rec.now_s();
    c_.dev.copy_h2d(p, params_.flat());
    c_.dev.wait_copies();
    c_.rec.span(Lane::h2d, "h2d params", t0, c_.rec.now_s(), "h2d");
    params.push_back(p);
    grads.push_back(grads_.shard());
  } else if (stage_ == 3) {
    params.push_back(params_.flat());
    grads.push_back(grads_.shard());
  } else {
    for (int u = 0; u < c_.unit_count(); ++u) {
      params.push_back(params_.chunk(u));
      grads.push_back(grads_.chunk(u));
    }
  }
  if (precision_.unscale_and_check(grads)) {
    grads.clear();
    grads_.release();
    return false;
  }
  c_.at("all", "optimizer");
  const double t0 = c_.rec.now_s();
  if (const double clip = clip_factor(grads, 1.0); clip < 1.0) {
    for (torch::Tensor& g : grads) g.mul_(clip);
  }
  optimizer_->step(params, grads, lr_scale);
  c_.dev.wait_compute();
  c_.rec.span(c_.host_optimizer() ? Lane::optimizer : Lane::compute, "optimizer", t0, c_.rec.now_s(), "optimizer");
  grads.clear();
  grads_.release();  // stages 2-3: the device gradient shard is done with (set to None, as FSDP2's zero_grad)

  if (offloaded_params && !c_.host_optimizer() && !separate_master_) {
    const double t1 = c_.rec.now_s();
    c_.dev.copy_d2h(params_.flat(), params[0]);
    c_.dev.wait_copies();
    c_.rec.span(Lane::d2h, "d2h params", t1, c_.rec.now_s(), "d2h");
  }
  if (stage_ == 1 || stage_ == 2) {
    sync_params();
  } else if (separate_master_) {
    master_to_params();
  }
  return true;
}

// 16-bit gradients beside an fp32 master, where the optimizer runs (the device, or the host with
// offload.optimizer, the gradients copied home first): the overflow check on the 16-bit gradients as they
// are, then unit by unit an fp32 copy of its gradient (unscaled in fp32, as GradScaler unscales) stepped
// into its part of the master, freed before the next unit's: the ZeRO paper's 2 + 2 + 12 bytes per
// parameter, not a full fp32 copy of every gradient besides (4 more per parameter at the step).
bool OptimizerStep::step_master_by_unit(double lr_scale) {
  std::vector<torch::Tensor> grads16;
  for (int u = 0; u < c_.unit_count(); ++u) grads16.push_back(grad_of(u));
  if (precision_.check(grads16)) {
    grads16.clear();
    grads_.release();
    return false;
  }
  torch::Tensor inv = precision_.unscale_factor();
  if (inv.defined()) inv = inv.to(master_.device());
  c_.at("all", "optimizer");
  const double t0 = c_.rec.now_s();
  // (inv.item() waits for the device: only when clipping asks for the true norm.)
  const double clip = c_.plan.optimizer.max_grad_norm > 0 ? clip_factor(grads16, inv.defined() ? inv.item<double>() : 1.0) : 1.0;
  grads16.clear();
  optimizer_->begin_step();
  for (int u = 0; u < c_.unit_count(); ++u) {
    const UnitRT& U = c_.unit(u);
    if (U.shard() == 0) continue;
    // On the host from the pool, where the host's bytes are counted (and pinned, on CUDA).
    torch::Tensor g = c_.host_optimizer() ? c_.hempty(U.shard()).copy_(grad_of(u)) : grad_of(u).to(torch::kFloat32);
    if (inv.defined()) g.mul_(inv);
    if (clip < 1.0) g.mul_(clip);
    optimizer_->step_range(0, U.shard_base, master_.narrow(0, U.shard_base, U.shard()), g, lr_scale);
  }
  if (c_.host_optimizer()) {
    c_.rec.span(Lane::optimizer, "optimizer", t0, c_.rec.now_s(), "optimizer");
  } else {
    c_.dev.wait_compute();
    c_.rec.span(Lane::compute, "optimizer", t0, c_.rec.now_s(), "optimizer");
  }
  grads_.release();
  if (stage_ == 1 || stage_ == 2) {
    sync_params();
  } else {
    master_to_params();
  }
  return true;
}

void OptimizerStep::master_to_params() {
  torch::Tensor& dst = params_.flat();
  const bool dst_host = params_.on_host() || (stage_ == 3 && c_.plan.offload.params);
  const double t1 = c_.rec.now_s();
  if (c_.host_optimizer() == dst_host) {
    dst.copy_(master_);  // same pool: rounded in place
    if (!dst_host) {
      c_.dev.wait_compute();
      c_.rec.span(Lane::compute, "round params", t1, c_.rec.now_s(), "cast");
    }
    return;
  }
  if (c_.host_optimizer()) {
    c_.dev.copy_h2d(dst, master_);
  } else {
    c_.dev.copy_d2h(dst, master_);
  }
  c_.dev.wait_copies();
  const bool h2d = c_.host_optimizer();
  c_.rec.span(h2d ? Lane::h2d : Lane::d2h, h2d ? "h2d params" : "d2h params", t1, c_.rec.now_s(), h2d ? "h2d" : "d2h");
}

void OptimizerStep::sync_params() {
  c_.cur_phase = "all_gather";
  const bool cast = c_.dt.param_sync != c_.dt.param;
  // The unit's updated chunk where the gather reads it: a separate master comes back into the chunk
  // (from the host when offloaded; rounded when the parameters are 16-bit).
  auto updated_chunk = [&](int u) {
    torch::Tensor src = params_.chunk(u);
    if (!separate_master_) return src;
    const UnitRT& U = c_.unit(u);
    torch::Tensor m = master_.narrow(0, U.shard_base, U.shard());
    if (c_.host_optimizer()) {
      const double t1 = c_.rec.now_s();
      c_.dev.copy_h2d(src, m);
      c_.dev.wait_copies();
      c_.rec.span(Lane::h2d, "h2d params " + U.name, t1, c_.rec.now_s(), "h2d", u);
    } else {
      src.copy_(m);
    }
    return src;
  };
  // A device master is rounded straight into a staged bucket's row (the unit's own chunk comes back
  // with the rest).
  const bool from_master = separate_master_ && !c_.host_optimizer();
  std::vector<CommTracker::Handle> works;
  for (const std::vector<int>& bucket : gather_buckets_) {
    if (bucket.size() == 1 && !cast) {
      // In place (DeepSpeed's and FSDP's way): this rank's updated chunk is already its slot of the
      // output, so no copy of the shard is made.
      const int u = bucket[0];
      UnitRT& U = c_.unit(u);
      c_.cur_unit = U.name;
      torch::Tensor src = updated_chunk(u);
      works.push_back(c_.tracker.issue(c_.comm.all_gather(U.full, src), c_.rec.now_s(), "all_gather " + U.name,
                                       "all_gather", u, -1));
      continue;
    }
    // Several units (or broadcast_fp16: in the wire dtype, every rank's parameters rounded through it):
    // the chunks travel in one staging buffer, [rank][unit chunks...], this rank's row filled in place,
    // copied out into each unit's full parameters once gathered.
    std::int64_t staged = 0;
    for (const int u : bucket) staged += c_.unit(u).shard();
    const UnitRT& first = c_.unit(bucket.front());
    const std::int64_t world = first.layout.world;  // the data-parallel group's ranks
    c_.cur_unit = first.name;
    const std::string what = bucket.size() == 1 ? first.name : "units " + std::to_string(bucket.front()) + "-" +
                                                                    std::to_string(bucket.back());
    torch::Tensor out = c_.dempty(world * staged, c_.dt.param_sync);
    torch::Tensor in = out.narrow(0, c_.comm.rank() * staged, staged);
    double t0 = c_.rec.now_s();
    std::int64_t at = 0;
    for (const int u : bucket) {
      const UnitRT& U = c_.unit(u);
      in.narrow(0, at, U.shard()).copy_(from_master ? master_.narrow(0, U.shard_base, U.shard()) : updated_chunk(u));
      at += U.shard();
    }
    c_.dev.wait_compute();
    c_.rec.span(Lane::compute, "stage params " + what, t0, c_.rec.now_s(), "cast", bucket.front());
    auto h = c_.tracker.issue(c_.comm.all_gather(out, in), c_.rec.now_s(), "all_gather " + what, "all_gather",
                              bucket.front(), -1);
    c_.tracker.wait(h);
    t0 = c_.rec.now_s();
    const torch::Tensor rows = out.view({world, staged});
    at = 0;
    for (const int u : bucket) {
      UnitRT& U = c_.unit(u);
      const std::int64_t n = U.shard();
      U.full.view({world, n}).copy_(rows.narrow(1, at, n));
      at += n;
    }
    c_.dev.wait_compute();
    c_.rec.span(Lane::compute, "unstage params " + what, t0, c_.rec.now_s(), "cast", bucket.back());
  }
  for (auto& h : works) c_.tracker.wait(h);
}

}  // namespace zeroplan::exec::pieces
