// The optimizer step on this rank's flat shard (PyTorch's fused kernels, optimizer.h):
//  stage 0       every parameter, on the device;
//  stages 1-3    this rank's shard; stages 1-2 then all-gather every rank's updated chunks (in fp16 with
//                broadcast_fp16, one unit at a time);
//  offload.optimizer: master shard (or the offloaded stage-3 shard itself), gradients and state on the
//                host, where the step runs; the updated master comes back to the device.
// Stage 3 with offloaded parameters and a device optimizer steps a device copy of the shard.
// OffloadModel (stage 0): parameters, gradients and state on the host, stepped there in place.
// With 16-bit parameters and master_fp32 the master is an fp32 shard (on the host with offload.optimizer)
// stepped with an fp32 copy of the gradients, then rounded into the 16-bit parameters (precision.cpp).
// Before the step the loss scale is taken out of the gradients; a step with non-finite gradients on some
// rank is skipped on every rank, touching neither parameters nor optimizer state.
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
  stepped_ = stage_ == 0 ? c.padded_total : c.shard_total;
}

bool OptimizerStep::step(double lr_scale) {
  torch::NoGradGuard no_grad;
  c_.at("all", "optimizer");
  const bool offloaded_params = stage_ == 3 && c_.plan.offload.params;
  if (host_grad_.defined()) {
    const double t0 = c_.rec.now_s();
    for (int u = 0; u < c_.unit_count(); ++u) {
      const UnitRT& U = c_.unit(u);
      c_.dev.copy_d2h(host_grad_.narrow(0, U.shard_base, U.shard()), grads_.chunk(u));
    }
    c_.dev.wait_copies();
    c_.rec.span(Lane::d2h, "d2h grads", t0, c_.rec.now_s(), "d2h");
  }
  // This rank's final gradient of unit u where the optimizer reads it.
  auto grad_of = [&](int u) {
    const UnitRT& U = c_.unit(u);
    if (host_grad_.defined()) return host_grad_.narrow(0, U.shard_base, U.shard());
    if (stage_ == 0) return grads_.full().narrow(0, U.base, U.layout.padded_numel());  // OffloadModel: host
    if (c_.host_optimizer()) return grads_.shard().narrow(0, U.shard_base, U.shard());
    return grads_.chunk(u);
  };
  std::vector<torch::Tensor> params, grads;
  if (c_.dt.master) {
    // fp32 gradients for the fp32 master, in the master's layout.
    torch::Tensor g = c_.host_optimizer() ? c_.hzeros(c_.shard_total) : c_.dempty(c_.shard_total);
    for (int u = 0; u < c_.unit_count(); ++u) g.narrow(0, c_.unit(u).shard_base, c_.unit(u).shard()).copy_(grad_of(u));
    params.push_back(master_);
    grads.push_back(g);
  } else if (stage_ == 0) {
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
  if (precision_.unscale_and_check(grads)) return false;
  c_.at("all", "optimizer");
  const double t0 = c_.rec.now_s();
  optimizer_->step(params, grads, lr_scale);
  c_.dev.synchronize();
  c_.rec.span(c_.host_optimizer() ? Lane::optimizer : Lane::compute, "optimizer", t0, c_.rec.now_s(), "optimizer");
  grads.clear();

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

void OptimizerStep::master_to_params() {
  torch::Tensor& dst = params_.flat();
  const bool dst_host = params_.on_host() || (stage_ == 3 && c_.plan.offload.params);
  const double t1 = c_.rec.now_s();
  if (c_.host_optimizer() == dst_host) {
    dst.copy_(master_);  // same pool: rounded in place
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
  std::vector<CommTracker::Handle> works;
  const bool cast = c_.dt.param_sync != c_.dt.param;
  for (int u = 0; u < c_.unit_count(); ++u) {
    UnitRT& U = c_.unit(u);
    if (U.numel() == 0) continue;
    c_.cur_unit = U.name;
    torch::Tensor out = U.full;
    // In place (DeepSpeed's and FSDP's way): this rank's updated chunk is already its slot of the output,
    // so no copy of the shard is made; a separate master comes back into it (from the host when offloaded).
    torch::Tensor src = params_.chunk(u);
    if (separate_master_) {
      const double t1 = c_.rec.now_s();
      torch::Tensor m = master_.narrow(0, U.shard_base, U.shard());
      if (c_.host_optimizer()) {
        c_.dev.copy_h2d(src, m);
        c_.dev.wait_copies();
        c_.rec.span(Lane::h2d, "h2d params " + U.name, t1, c_.rec.now_s(), "h2d", u);
      } else {
        src.copy_(m);
      }
    }
    const double t = c_.rec.now_s();
    if (!cast) {
      works.push_back(c_.tracker.issue(c_.comm.all_gather(out, src), t, "all_gather " + U.name, "all_gather", u, -1));
      continue;
    }
    // broadcast_fp16: the unit's chunks travel in fp16 and every rank's parameters are rounded through it.
    torch::Tensor wire_out = c_.dempty(U.layout.padded_numel(), c_.dt.param_sync);
    torch::Tensor wire_in = src.to(c_.dt.param_sync);
    auto h = c_.tracker.issue(c_.comm.all_gather(wire_out, wire_in), t, "all_gather " + U.name, "all_gather", u, -1);
    c_.tracker.wait(h);
    out.copy_(wire_out);
  }
  for (auto& h : works) c_.tracker.wait(h);
}

}  // namespace zeroplan::exec::pieces
