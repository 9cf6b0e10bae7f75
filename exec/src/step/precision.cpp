// Precision (the simulator's precision.cpp and bytes_of): 16-bit parameters and gradients with an fp32
// master shard and fp32 optimizer state (fairscale FSDP's _fp16_shard / _fp32_shard, DeepSpeed's fp16 and
// bf16 optimizers); gradients cast to reduce_dtype for their collectives (fp32 with fp32_reduce_scatter);
// stage 1-2 updated shards all-gathered in fp16 with broadcast_fp16; unit forwards under autocast to the
// compute dtype; the loss scale, with every rank checking its own gradient shard and one all-reduce so
// that all ranks skip a step together.
#include <ATen/autocast_mode.h>

#include "pieces.h"
#include "strformat.h"
#include "zeroplan/exec/exec_errors.h"

namespace zeroplan::exec::pieces {

namespace {

torch::ScalarType scalar_type_named(const std::string& name) {
  if (name == "fp16") return torch::kFloat16;
  if (name == "bf16") return torch::kBFloat16;
  return torch::kFloat32;
}

}  // namespace

Dtypes dtypes_of(const Plan& plan) {
  const zeroplan::Precision& p = plan.precision;
  Dtypes d;
  d.param = d.grad = scalar_type_named(p.param_dtype);
  d.compute = scalar_type_named(p.compute_dtype);
  d.all_reduce = scalar_type_named(p.reduce_dtype);
  d.reduce_scatter = p.fp32_reduce_scatter ? torch::kFloat32 : d.all_reduce;
  // broadcast_fp16 rounds fp32 parameters through fp16; 16-bit parameters already travel in 16 bits.
  d.param_sync = p.broadcast_fp16 && d.param == torch::kFloat32 ? torch::kFloat16 : d.param;
  const bool half_params = d.param != torch::kFloat32;
  d.master = half_params && p.master_fp32;
  d.state = half_params && !p.master_fp32 ? d.param : torch::kFloat32;
  d.autocast = d.compute != torch::kFloat32;
  return d;
}

ComputeScope::ComputeScope(const Dtypes& dt, at::DeviceType device) : on_(dt.autocast), device_(device) {
  if (!on_) return;
  was_enabled_ = at::autocast::is_autocast_enabled(device_);
  was_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_dtype(device_, dt.compute);
  at::autocast::increment_nesting();
}

ComputeScope::~ComputeScope() {
  if (!on_) return;
  // Weights cast for this unit are dropped with the scope (autocast's cache lives while it is on).
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, was_enabled_);
  at::autocast::set_autocast_dtype(device_, was_dtype_);
}

Precision::Precision(Ctx& c) : c_(c), scaler_(c.plan.precision.loss_scale, c.dev.torch_device()) {}

bool Precision::check(const std::vector<torch::Tensor>& grads) {
  if (!scaler_.enabled()) return false;
  c_.at("all", "loss_scale");
  const double t0 = c_.rec.now_s();
  const bool skip = scaler_.unscale_and_check(grads, c_.world_comm != nullptr ? c_.world_comm : &c_.comm, false);
  c_.rec.span(Lane::compute, skip ? "loss_scale (skip)" : "loss_scale", t0, c_.rec.now_s(), "optimizer");
  return skip;
}

bool Precision::unscale_and_check(const std::vector<torch::Tensor>& grads) {
  if (!scaler_.enabled()) return false;
  c_.at("all", "loss_scale");
  const double t0 = c_.rec.now_s();
  const bool skip = scaler_.unscale_and_check(grads, c_.world_comm != nullptr ? c_.world_comm : &c_.comm);
  c_.rec.span(Lane::compute, skip ? "loss_scale (skip)" : "loss_scale", t0, c_.rec.now_s(), "optimizer");
  return skip;
}

}  // namespace zeroplan::exec::pieces
