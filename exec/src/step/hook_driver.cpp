// The hook driver (hook_driver.h): the pieces of pieces.h in the order a model's own forward and backward
// run them. It decides nothing the pieces decide; what it adds is the order: a backward that finishes
// units out of order (a tied weight's gradient completes last; a skip connection's source late) is
// handed to the pieces strictly in reverse unit order, as the step driver does.
#include "zeroplan/exec/hook_driver.h"

#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <algorithm>
#include <utility>

#include "pieces.h"
#include "strformat.h"

namespace zeroplan::exec {

namespace {

// A unit's parameters and buffers registered under their own dotted names (a tree of plain modules), so
// the pieces see the same tensors the model computes with, named as the model names them.
class HookUnitModule final : public zoo::UnitModule {
 public:
  explicit HookUnitModule(const HookUnitSpec& spec) {
    for (const auto& [name, t] : spec.params) at(name).first->register_parameter(at(name).second, t, t.requires_grad());
    for (const auto& [name, t] : spec.buffers) at(name).first->register_buffer(at(name).second, t);
  }
  torch::Tensor forward(const torch::Tensor&) override {
    throw ExecError("a hook-driven unit runs inside its model's own forward");
  }

 private:
  // The module that holds "a.b.c" (created on first use) and the leaf name "c".
  std::pair<torch::nn::Module*, std::string> at(const std::string& dotted) {
    torch::nn::Module* m = this;
    std::size_t start = 0;
    for (std::size_t dot = dotted.find('.'); dot != std::string::npos; dot = dotted.find('.', start)) {
      const std::string part = dotted.substr(start, dot - start);
      auto children = m->named_children();
      auto* found = children.find(part);
      m = found != nullptr ? found->get() : m->register_module(part, std::make_shared<torch::nn::Module>()).get();
      start = dot + 1;
    }
    return {m, dotted.substr(start)};
  }
};

// One saved tensor through the activation-offload piece, for a caller that packs and unpacks itself.
struct SharedSavedHooks final : torch::autograd::SavedVariableHooks {
  explicit SharedSavedHooks(std::unique_ptr<torch::autograd::SavedVariableHooks> h) : inner(std::move(h)) {}
  void call_pack_hook(const torch::Tensor& t) override { inner->call_pack_hook(t); }
  torch::Tensor call_unpack_hook() override { return inner->call_unpack_hook(); }
  std::unique_ptr<torch::autograd::SavedVariableHooks> inner;
};

}  // namespace

using pieces::ActivationOffload;
using pieces::AdaScale;
using pieces::Checkpoint;
using pieces::Ctx;
using pieces::GradSync;
using pieces::OptimizerStep;
using pieces::ParamResidency;
using pieces::Precision;
using pieces::ReplicaSync;

class HookDriver::Impl {
 public:
  Impl(std::vector<HookUnitSpec> specs, const Plan& plan, Communicator& comm, Device& dev, Recorder& rec,
       const ExecOptions& opt)
      : dev_(dev) {
    if (plan.pipeline_stages > 1) {
      throw ExecError(detail::format("plan: pipeline_stages {} needs the model as a chain of units, which a model "
                                     "trained in its own forward is not: run it with pipeline_stages 1",
                                     plan.pipeline_stages));
    }
    if (plan.offload_model.enabled) {
      throw ExecError("plan: offload_model needs the model as a chain of units (its slices visit the device one at a "
                      "time), which a model trained in its own forward is not");
    }
    pieces::check_runnable(plan, comm.world_size());
    if (specs.empty()) throw ExecError("a model with no units");
    model_.name = "python";
    for (const auto& s : specs) {
      for (const auto& [name, t] : s.params) {
        if (t.scalar_type() != torch::kFloat32) {
          throw ExecError(detail::format("unit {}: parameter {} is {}; the model's parameters must be fp32 (the "
                                         "plan's precision makes the 16-bit copies)", s.name, name,
                                         c10::toString(t.scalar_type())));
        }
      }
      model_.units.push_back({s.name, s.type, std::make_shared<HookUnitModule>(s), s.borrowed});
    }
    c_ = std::make_unique<Ctx>(model_, plan, comm, dev, rec, opt.ranks_per_node);
    params_ = std::make_unique<ParamResidency>(*c_);
    grads_ = std::make_unique<GradSync>(*c_);
    offload_ = std::make_unique<ActivationOffload>(*c_);
    precision_ = std::make_unique<Precision>(*c_);
    optimizer_ = std::make_unique<OptimizerStep>(*c_, *params_, *grads_, *precision_);
    replicas_ = std::make_unique<ReplicaSync>(*c_, *params_, *grads_);
    if (plan.adascale) adascale_ = std::make_unique<AdaScale>(*c_);
    checkpoint_ = std::make_unique<Checkpoint>(*c_, *params_, *optimizer_, *precision_);
    done_.assign(static_cast<std::size_t>(c_->unit_count()), 0);
  }

  Ctx& c() { return *c_; }
  const Ctx& c() const { return *c_; }

  // 16-bit parameters beside an fp32 master: the master's shards all-gathered unit by unit (what the
  // optimizer steps, as FSDP's state dict gives its fp32 parameters); else the parameters themselves.
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters() {
    const torch::Tensor& master = optimizer_->master();
    if (!c_->dt.master) return params_->full_copy();
    torch::NoGradGuard no_grad;
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (int u = 0; u < c_->unit_count(); ++u) {
      const pieces::UnitRT& U = c_->unit(u);
      c_->at(U.name, "gather_parameters");
      torch::Tensor full = c_->dempty(U.layout.padded_numel(), torch::kFloat32);
      if (U.numel() > 0) {
        torch::Tensor mine = master.narrow(0, U.shard_base, U.shard());
        if (U.layout.world == 1) {
          full.copy_(mine);
        } else {
          full.narrow(0, U.layout.shard_begin(c_->rank), U.shard()).copy_(mine);
          torch::Tensor chunk = full.narrow(0, U.layout.shard_begin(c_->rank), U.shard());
          c_->comm.all_gather(full, chunk)->wait();
        }
      }
      for (const auto& s : U.flat.slots()) {
        out.emplace_back(U.name + "." + s.name, full.narrow(0, s.offset, s.numel).view(s.shape).to(torch::kCPU, torch::kFloat32, false, true));
      }
    }
    return out;
  }

  std::vector<LocalShard> local_shards() {
    torch::NoGradGuard no_grad;
    std::vector<LocalShard> out;
    const torch::Tensor& master = optimizer_->master();
    for (int u = 0; u < c_->unit_count(); ++u) {
      const pieces::UnitRT& U = c_->unit(u);
      const std::int64_t lo = U.shard_begin(c_->rank), hi = lo + U.shard();
      torch::Tensor mine;  // this rank's shard of the unit's flat buffer
      if (U.numel() > 0) {
        mine = c_->dt.master ? master.narrow(0, U.shard_base, U.shard()) : params_->chunk(u);
      }
      for (const auto& s : U.flat.slots()) {
        const std::int64_t a = std::clamp(s.offset, lo, hi), b = std::clamp(s.offset + s.numel, lo, hi);
        LocalShard e{U.name + "." + s.name, s.shape, a - s.offset, {}};
        e.values = b > a ? mine.narrow(0, a - lo, b - a).to(torch::kCPU, torch::kFloat32, false, true)
                         : torch::empty({0}, torch::kFloat32);
        if (b <= a) e.offset = 0;
        out.push_back(std::move(e));
      }
    }
    return out;
  }

  void begin_forward(int micro, std::int64_t step) {
    micro_ = micro;
    if (micro == 0 && torch::GradMode::is_enabled() && !step_open_) {
      step_open_ = true;
      step_ = step;
      t_step_ = c_->rec.now_s();
      grads_->zero();
      replicas_->begin_step(step);
      if (adascale_) adascale_->begin_step();
      loss_scale_ = precision_->loss_scale();
    }
  }
  void before_forward(int u) {
    c_->at(c_->unit(u).name, "forward");
    params_->before_fwd(u, micro_);
    t_fwd_ = c_->rec.now_s();
  }
  void after_forward(int u) {
    dev_.wait_compute();
    c_->rec.span(Lane::compute, "forward " + c_->unit(u).name, t_fwd_, c_->rec.now_s(), "forward", u, micro_);
    params_->after_fwd(u);
  }
  void end_eval() {
    for (int u = c_->unit_count() - 1; u >= 0; --u) params_->after_bwd(u);
  }
  double backward_scale() const {
    return loss_scale_ / (static_cast<double>(replicas_->grad_ranks()) * c_->plan.microbatches);
  }
  void before_backward(int u) {
    if (!in_backward_) {
      in_backward_ = true;
      next_ = c_->unit_count() - 1;
      std::fill(done_.begin(), done_.end(), 0);
    }
    c_->at(c_->unit(u).name, "backward");
    params_->before_bwd(u, micro_);
    offload_->before_bwd(u);
  }
  void accumulate(int u, int slot, const torch::Tensor& g) {
    const pieces::UnitRT& U = c_->unit(u);
    const auto& slots = U.flat.slots();
    if (slot < 0 || slot >= static_cast<int>(slots.size())) {
      throw ExecError(detail::format("unit {}: no parameter slot {} (it has {})", U.name, slot, slots.size()));
    }
    const auto& s = slots[static_cast<std::size_t>(slot)];
    if (g.numel() != s.numel) {
      throw ExecError(detail::format("unit {}: gradient of {} has {} elements, the parameter {}", U.name, s.name,
                                     g.numel(), s.numel));
    }
    torch::NoGradGuard no_grad;
    grads_->region(u).narrow(0, s.offset, s.numel).add_(g.reshape({-1}));
    if (adascale_) adascale_->own(u, s.offset, g);
  }
  void backward_done(int u) {
    if (!in_backward_) before_backward(u);
    done_[static_cast<std::size_t>(u)] = 1;
    flush();
  }
  void end_backward() {
    if (!in_backward_) return;  // a backward that reached no unit
    std::fill(done_.begin(), done_.end(), 1);
    flush();
    grads_->finish_microbatch();
    in_backward_ = false;
  }
  StepStats step() {
    StepStats stats;
    if (!step_open_) throw ExecError("step() before any forward and backward of the step");
    grads_->finish_step();
    if (adascale_) stats.lr_gain = adascale_->finish(*grads_);
    stats.loss_scale = loss_scale_;
    stats.skipped = !optimizer_->step(stats.lr_gain);
    precision_->after_step(stats.skipped);
    replicas_->after_step(step_);
    dev_.synchronize();
    stats.time_s = c_->rec.now_s() - t_step_;
    stats.phase_s = c_->rec.end_step();
    step_open_ = false;
    return stats;
  }

  Device& dev_;
  zoo::Model model_;
  std::unique_ptr<Ctx> c_;
  std::unique_ptr<ParamResidency> params_;
  std::unique_ptr<GradSync> grads_;
  std::unique_ptr<ActivationOffload> offload_;
  std::unique_ptr<Precision> precision_;
  std::unique_ptr<OptimizerStep> optimizer_;
  std::unique_ptr<ReplicaSync> replicas_;
  std::unique_ptr<AdaScale> adascale_;
  std::unique_ptr<Checkpoint> checkpoint_;

 private:
  // Units done, from the last one down: resharded, then their gradients reduced (FSDP reshards first).
  void flush() {
    while (next_ >= 0 && done_[static_cast<std::size_t>(next_)]) {
      const int u = next_--;
      c_->at(c_->unit(u).name, "backward");
      params_->after_bwd(u);
      offload_->after_bwd(u);
      grads_->after_bwd(u, micro_, micro_ == c_->plan.microbatches - 1);
    }
  }
  int micro_ = 0;
  int next_ = -1;
  bool in_backward_ = false, step_open_ = false;
  std::int64_t step_ = 0;
  double t_step_ = 0, t_fwd_ = 0, loss_scale_ = 1;
  std::vector<char> done_;
};

namespace {
// A torch error in a piece becomes one line naming the unit and phase (pieces::rethrow_unit_error).
template <typename F>
auto hook_guarded(HookDriver::Impl* impl, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (...) {
    pieces::rethrow_unit_error(impl->c_.get(), impl->dev_);
  }
}
}  // namespace

HookDriver::HookDriver(std::vector<HookUnitSpec> units, const Plan& plan, Communicator& comm, Device& device,
                       Recorder& recorder, const ExecOptions& options) {
  try {
    impl_ = std::make_unique<Impl>(std::move(units), plan, comm, device, recorder, options);
  } catch (...) {
    pieces::rethrow_unit_error(nullptr, device);
  }
}
HookDriver::~HookDriver() = default;

int HookDriver::unit_count() const { return impl_->c().unit_count(); }
int HookDriver::microbatches() const { return impl_->c().plan.microbatches; }
bool HookDriver::grads_in_place() const { return impl_->c().plan.grads_in_place(); }
std::vector<std::string> HookDriver::param_names(int u) const {
  std::vector<std::string> out;
  for (const auto& s : impl_->c().unit(u).flat.slots()) out.push_back(s.name);
  return out;
}
bool HookDriver::checkpointed(int u) const { return impl_->c().unit(u).checkpoint; }
torch::ScalarType HookDriver::compute_dtype() const { return impl_->c().dt.compute; }
torch::ScalarType HookDriver::param_dtype() const { return impl_->c().dt.param; }
bool HookDriver::autocast() const { return impl_->c().dt.autocast; }

void HookDriver::begin_forward(int micro, std::int64_t step) { hook_guarded(impl_.get(), [&] { impl_->begin_forward(micro, step); }); }
void HookDriver::before_forward(int u) { hook_guarded(impl_.get(), [&] { impl_->before_forward(u); }); }
void HookDriver::after_forward(int u) { hook_guarded(impl_.get(), [&] { impl_->after_forward(u); }); }
void HookDriver::end_eval() { hook_guarded(impl_.get(), [&] { impl_->end_eval(); }); }
double HookDriver::backward_scale() const { return impl_->backward_scale(); }
void HookDriver::before_backward(int u) { hook_guarded(impl_.get(), [&] { impl_->before_backward(u); }); }
void HookDriver::accumulate(int u, int slot, const torch::Tensor& g) {
  hook_guarded(impl_.get(), [&] { impl_->accumulate(u, slot, g); });
}
void HookDriver::backward_done(int u) { hook_guarded(impl_.get(), [&] { impl_->backward_done(u); }); }
void HookDriver::end_backward() { hook_guarded(impl_.get(), [&] { impl_->end_backward(); }); }
StepStats HookDriver::step() { return hook_guarded(impl_.get(), [&] { return impl_->step(); }); }

bool HookDriver::offload_on() const { return impl_->offload_->on(); }
bool HookDriver::begin_capture(int u, const torch::Tensor& in) {
  return hook_guarded(impl_.get(), [&] { return impl_->offload_->begin_capture(u, impl_->c().unit(u).checkpoint, in); });
}
std::shared_ptr<torch::autograd::SavedVariableHooks> HookDriver::pack(const torch::Tensor& t) {
  auto h = std::make_shared<SharedSavedHooks>(impl_->offload_->hooks());
  h->call_pack_hook(t);
  return h;
}
void HookDriver::end_capture(int u, const torch::Tensor& in, const torch::Tensor& out) {
  hook_guarded(impl_.get(), [&] { impl_->offload_->end_forward(u, in, out); });
}

std::vector<std::pair<std::string, torch::Tensor>> HookDriver::full_parameters() {
  return hook_guarded(impl_.get(), [&] { return impl_->full_parameters(); });
}
std::vector<HookDriver::LocalShard> HookDriver::local_shards() {
  return hook_guarded(impl_.get(), [&] { return impl_->local_shards(); });
}
void HookDriver::save_checkpoint(const std::string& dir, std::int64_t step) {
  hook_guarded(impl_.get(), [&] {
    impl_->checkpoint_->save(dir, step);
    // Every rank returns once the manifest exists: a rank may load it straight away (a resumed engine).
    impl_->c().comm.barrier();
  });
}
std::int64_t HookDriver::load_checkpoint(const std::string& dir, bool other_run) {
  return hook_guarded(impl_.get(), [&] { return impl_->checkpoint_->load(dir, other_run); });
}
bool HookDriver::views_valid() const { return impl_->params_->views_valid(); }

}  // namespace zeroplan::exec
