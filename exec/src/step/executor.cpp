#include "zeroplan/exec/executor.h"

#include "strformat.h"

#include <algorithm>
#include <utility>

#include "pieces.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/knobs.h"

namespace zeroplan::exec {

OutOfDeviceMemory::OutOfDeviceMemory(std::string unit, std::string phase, std::int64_t need_bytes,
                                     std::int64_t limit_bytes)
    : ExecError(ErrorKind::run_failed, detail::format("out of device memory in unit {}, phase {}: need {} bytes, limit {}", unit, phase,
                            need_bytes, limit_bytes)),
      unit_(std::move(unit)),
      phase_(std::move(phase)),
      need_bytes_(need_bytes),
      limit_bytes_(limit_bytes) {}

// What the knob registry marks as not run (Support::no) and the plan uses: "pipeline_stages 2", ...
std::vector<std::string> unsupported_features(const Plan& p) { return unsupported_knobs(p, Component::run); }

using pieces::Activations;
using pieces::Ctx;
using pieces::GradSync;
using pieces::OptimizerStep;
using pieces::ParamResidency;
using pieces::Precision;
using pieces::ReplicaSync;
using pieces::AdaScale;
using pieces::Checkpoint;
using pieces::OffloadModel;
using pieces::Pipeline;
using pieces::UnitRT;
using pieces::differentiate;
using pieces::loss_grad;
using pieces::model_input;

// The step driver: for each microbatch, forward over the units then backward in reverse, asking the
// pieces (pieces.h) what each unit waits for and what follows it; then the optimizer step. It reads like
// the simulator's schedule (sim/src/lowering/step.cpp) and tests no plan field itself.
class Executor::Impl {
 public:
  Impl(zoo::Model& model, const Plan& plan, Communicator& comm, Device& dev, Recorder& rec, const ExecOptions& opt)
      : dev_(dev) {
    pieces::check_runnable(plan, comm.world_size());
    if (model.units.empty()) throw ExecError("model " + model.name + " has no units");
    guarded([&] {
      pipe_ = std::make_unique<Pipeline>(plan, static_cast<int>(model.units.size()), comm);
      const bool piped = plan.pipeline_stages > 1;
      c_ = std::make_unique<Ctx>(model, plan, pipe_->dp(), dev, rec, piped ? 0 : opt.ranks_per_node, pipe_->units());
      pipe_->attach(*c_, model);
      params_ = std::make_unique<ParamResidency>(*c_);
      grads_ = std::make_unique<GradSync>(*c_);
      // One microbatch's activations at a time, or with pipeline stages every microbatch's (the schedule
      // keeps several alive).
      for (int k = 0; k < (piped ? plan.microbatches : 1); ++k) acts_.push_back(std::make_unique<Activations>(*c_));
      precision_ = std::make_unique<Precision>(*c_);
      optimizer_ = std::make_unique<OptimizerStep>(*c_, *params_, *grads_, *precision_);
      replicas_ = std::make_unique<ReplicaSync>(*c_, *params_, *grads_);
      if (plan.adascale) adascale_ = std::make_unique<AdaScale>(*c_);
      if (plan.offload_model.enabled) offload_model_ = std::make_unique<OffloadModel>(*c_, *params_, *grads_, adascale_.get());
      checkpoint_ = std::make_unique<Checkpoint>(*c_, *params_, *optimizer_, *precision_);
      // On CUDA the next microbatch is made while the device computes, in pinned memory (a DataLoader
      // worker with pin_memory), or drawn on the device where the task can; on a CPU device in line, as the
      // simulator's compute takes every core.
      const bool cuda = dev.torch_device().is_cuda();
      batches_ = std::make_unique<pieces::Batches>(*model.task, c_->rank, plan.microbatches, plan.micro_batch, cuda, cuda,
                                                   dev.torch_device());
    });
  }

  StepStats step(std::int64_t step) {
    StepStats stats;
    guarded([&] { stats = run_step(step); });
    return stats;
  }

  std::vector<std::pair<std::string, torch::Tensor>> full_parameters() {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    guarded([&] { out = params_->full_copy(); });
    // A pipeline stage's replicas of tied weights are the owner's (on its stage).
    std::erase_if(out, [](const auto& p) { return p.first.find(".tied.") != std::string::npos; });
    return out;
  }
  int first_unit() const { return c_->first_unit; }
  int pipeline_stage() const { return c_->plan.pipeline_stages > 1 ? pipe_->stage() : -1; }

  void save_checkpoint(const std::string& dir, std::int64_t step) {
    guarded([&] { checkpoint_->save(dir, step); });
  }
  std::int64_t load_checkpoint(const std::string& dir, bool other_run) {
    std::int64_t step = 0;
    guarded([&] { step = checkpoint_->load(dir, other_run); });
    return step;
  }

  std::int64_t optimizer_shard_numel() const { return optimizer_->stepped_numel(); }
  int all_reduce_buckets() const { return grads_->buckets(); }
  int units_with_params() const {
    return static_cast<int>(std::count_if(c_->units.begin(), c_->units.end(), [](const UnitRT& u) { return u.numel() > 0; }));
  }
  bool views_valid() const { return params_->views_valid(); }
  // A microbatch that offloaded (a pipeline's checkpointed microbatches recompute on the device).
  std::vector<OffloadedActivations> offloaded_activations() const {
    if (!acts_.front()->offload().on()) return {};
    for (const auto& a : acts_) {
      auto s = a->offload().summary();
      if (std::any_of(s.begin(), s.end(), [](const OffloadedActivations& o) { return o.offloaded > 0; })) return s;
    }
    return acts_.front()->offload().summary();
  }
  LossScaler& loss_scaler() { return precision_->scaler(); }

 private:
  // Runs f; a refused device allocation becomes OutOfDeviceMemory, any other torch error UnitFailure,
  // both naming the unit and phase (torch's own cause in one line, never its backtrace).
  template <typename F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {
      pieces::rethrow_unit_error(c_.get(), dev_);
    }
  }

  // Takes the input: once unit 0 ran, only what that unit keeps of it holds it (its saved tensors, or
  // a checkpointed unit's kept input, on the host with checkpoint_offload).
  Activations& acts(int micro) { return *acts_[static_cast<std::size_t>(micro) % acts_.size()]; }

  // `phase` "recompute": a pipeline stage's checkpointed microbatch rebuilt before its backward.
  torch::Tensor forward(torch::Tensor x, int micro, const char* phase = "forward") {
    Ctx& c = *c_;
    for (int u = 0; u < c.unit_count(); ++u) {
      c.at(c.unit(u).name, phase);
      params_->before_fwd(u, micro);
      const double t0 = c.rec.now_s();
      torch::Tensor out = acts(micro).forward(u, x, micro);
      dev_.wait_compute();
      c.rec.span(Lane::compute, std::string(phase) + " " + c.unit(u).name, t0, c.rec.now_s(), phase, u, micro);
      x = out.detach();
      params_->after_fwd(u);
    }
    return x;
  }

  // A pipeline stage's checkpointed forward (fairscale Pipe's checkpoint): no graph, nothing kept.
  torch::Tensor forward_no_graph(torch::Tensor x, int micro) {
    Ctx& c = *c_;
    torch::NoGradGuard no_grad;
    for (int u = 0; u < c.unit_count(); ++u) {
      c.at(c.unit(u).name, "forward");
      params_->before_fwd(u, micro);
      const double t0 = c.rec.now_s();
      {
        pieces::ComputeScope compute(c.dt, dev_.torch_device().type());
        x = c.unit(u).module->forward(x);
      }
      dev_.wait_compute();
      c.rec.span(Lane::compute, "forward " + c.unit(u).name, t0, c.rec.now_s(), "forward", u, micro);
      params_->after_fwd(u);
    }
    return x;
  }

  // Unit u's backward: gradients of its parameters (and of the weights it borrows) accumulate where
  // GradSync keeps them; returns the gradient of its input (undefined for the model's input).
  torch::Tensor unit_backward(int u, const torch::Tensor& grad, int micro) {
    torch::Tensor out = acts(micro).output_for_backward(u, micro);
    const double t0 = c_->rec.now_s();
    torch::Tensor grad_in = differentiate(*c_, u, std::move(out), acts(micro).input(u), grad,
                                          [this](int owner) { return grads_->region(owner); }, adascale_.get(),
                                          c_->plan.grads_in_place());
    acts(micro).after_bwd(u);
    dev_.wait_compute();
    c_->rec.span(Lane::compute, "backward " + c_->unit(u).name, t0, c_->rec.now_s(), "backward", u, micro);
    return grad_in;
  }

  // Returns the gradient of the first unit's input (a pipeline stage sends it to the one before).
  torch::Tensor backward(torch::Tensor grad, int micro, bool last_micro) {
    for (int u = c_->unit_count() - 1; u >= 0; --u) {
      c_->at(c_->unit(u).name, "backward");
      params_->before_bwd(u, micro);
      grad = unit_backward(u, grad, micro);
      // Gathered parameters go before the gradient is reduce-scattered (FSDP reshards first).
      params_->after_bwd(u);
      pipe_->tied_grads_out(u, *grads_, last_micro);  // tied weights across pipeline stages: to the owner,
      pipe_->tied_grads_in(u, *grads_, last_micro);   // and added to the owner's
      grads_->after_bwd(u, micro, last_micro);
    }
    return grad;
  }

  // The microbatch from the data loader; the time the step waited for it is the "data" phase (made in
  // line, or the worker's batch not ready yet), which the simulator does not model: compare says so.
  zoo::Batch data(std::int64_t step, int k) {
    c_->at("all", "data");
    const double t0 = c_->rec.now_s();
    zoo::Batch batch = batches_->get(step, k);
    c_->rec.span(Lane::compute, "data", t0, c_->rec.now_s(), "data", -1, k);
    return batch;
  }

  // A pipeline stage's step: the schedule's forwards and backwards in the Pipeline piece's order, the
  // stage's input from the stage before (the data on the first), its output to the one after (the loss
  // on the last), then the data-parallel step of the stage's units.
  StepStats run_pipeline_step(std::int64_t step) {
    Ctx& c = *c_;
    Pipeline& pp = *pipe_;
    const double t_step = c.rec.now_s();
    const int m = c.plan.microbatches;
    grads_->zero();
    replicas_->begin_step(step);
    double loss_sum = 0, busy_s = 0, span_s = 0;
    const double loss_scale = precision_->loss_scale();
    const double scale = loss_scale / (static_cast<double>(replicas_->grad_ranks()) * m);
    std::vector<torch::Tensor> kept_in(static_cast<std::size_t>(m)), gz(static_cast<std::size_t>(m));
    std::vector<pieces::Recompute> recompute(static_cast<std::size_t>(m));
    std::vector<std::shared_ptr<zoo::UnitModule>> modules;  // a checkpointed microbatch recomputes them all
    for (const UnitRT& U : c.units) modules.push_back(U.module);
    auto target = [&](int k) { return data(step, k).target.to(dev_.torch_device()); };
    for (const PipelineOp& op : pp.order()) {
      const int k = op.microbatch;
      const auto j = static_cast<std::size_t>(k);
      const bool ckpt = pp.checkpointed(k);
      if (op.forward) {
        torch::Tensor x = pp.first() ? model_input(c, data(step, k).input) : pp.recv_input(k);
        const double t0 = c.rec.now_s();
        if (ckpt) {
          kept_in[j] = x;
          recompute[j].save_rng(dev_);
          x = forward_no_graph(std::move(x), k);
        } else {
          x = forward(std::move(x), k);
        }
        if (pp.last() && !ckpt) gz[j] = loss_grad(c, std::move(x), target(k), k, scale, loss_sum);
        busy_s += c.rec.now_s() - t0;
        if (!pp.last()) pp.send_output(k, x);
        continue;
      }
      torch::Tensor g;
      double t0 = c.rec.now_s();
      if (ckpt) {
        torch::Tensor x;
        {
          pieces::Recompute::Replay replay(recompute[j], dev_, modules);
          x = forward(std::exchange(kept_in[j], torch::Tensor()), k, "recompute");
        }
        recompute[j].drop_rng();
        if (pp.last()) gz[j] = loss_grad(c, std::move(x), target(k), k, scale, loss_sum);
      }
      busy_s += c.rec.now_s() - t0;
      g = pp.last() ? std::exchange(gz[j], torch::Tensor()) : pp.recv_grad(k);
      t0 = c.rec.now_s();
      torch::Tensor g_in = backward(std::move(g), k, k == m - 1);
      grads_->finish_microbatch();
      recompute[j].restore_buffers();  // BatchNorm-style statistics the recompute updated again
      busy_s += c.rec.now_s() - t0;
      span_s = c.rec.now_s() - t_step;
      if (!pp.first()) pp.send_grad(k, g_in);
    }
    grads_->finish_step();
    StepStats stats;
    stats.loss_scale = loss_scale;
    stats.skipped = !optimizer_->step(1.0);
    precision_->after_step(stats.skipped);
    pp.tied_params_after_step(*params_);
    stats.loss = pp.share_loss(loss_sum / m);
    pp.finish_step();
    dev_.synchronize();
    stats.time_s = c.rec.now_s() - t_step;
    stats.pipeline_busy_s = busy_s;
    stats.pipeline_span_s = span_s;
    stats.phase_s = c.rec.end_step();
    return stats;
  }

  StepStats run_step(std::int64_t step) {
    if (c_->plan.pipeline_stages > 1) return run_pipeline_step(step);
    Ctx& c = *c_;
    const double t_step = c.rec.now_s();
    const int m = c.plan.microbatches;
    grads_->zero();
    replicas_->begin_step(step);
    if (adascale_) adascale_->begin_step();
    double loss_sum = 0;
    // The mean over the batch of the ranks that reduce gradients, times the loss scale (16-bit gradients).
    const double loss_scale = precision_->loss_scale();
    const double scale = loss_scale / (static_cast<double>(replicas_->grad_ranks()) * m);
    for (int k = 0; k < m && offload_model_; ++k) {
      offload_model_->microbatch(step, k, scale / c.plan.offload_model.microbatches, loss_sum);
    }
    for (int k = 0; k < m && !offload_model_; ++k) {
      zoo::Batch batch = data(step, k);
      // The batch's own references go (on a CPU device `to` is the same tensor): the input lives as long
      // as the first unit keeps it.
      torch::Tensor input = model_input(c, std::exchange(batch.input, torch::Tensor()));
      torch::Tensor target = std::exchange(batch.target, torch::Tensor()).to(dev_.torch_device());
      torch::Tensor gz = loss_grad(c, forward(std::move(input), k), target, k, scale, loss_sum);
      backward(std::move(gz), k, k == m - 1);  // the logits' gradient dies with the last unit's backward
      grads_->finish_microbatch(k == m - 1 && optimizer_->steps_beside_last_reduce_scatter() ? 1 : 0);
    }
    if (!optimizer_->steps_beside_last_reduce_scatter()) grads_->finish_step();
    StepStats stats;
    if (adascale_) stats.lr_gain = adascale_->finish(*grads_);
    stats.loss_scale = loss_scale;
    stats.skipped = !optimizer_->step(stats.lr_gain);
    precision_->after_step(stats.skipped);
    replicas_->after_step(step);
    dev_.synchronize();
    stats.time_s = c.rec.now_s() - t_step;
    stats.loss = loss_sum / (m * (offload_model_ ? c.plan.offload_model.microbatches : 1));
    stats.phase_s = c.rec.end_step();
    return stats;
  }

  Device& dev_;
  std::unique_ptr<Ctx> c_;
  std::unique_ptr<ParamResidency> params_;
  std::unique_ptr<GradSync> grads_;
  std::unique_ptr<Pipeline> pipe_;  // pipeline stages (with one stage: the whole model, the world)
  std::vector<std::unique_ptr<Activations>> acts_;
  std::unique_ptr<Precision> precision_;
  std::unique_ptr<OptimizerStep> optimizer_;
  std::unique_ptr<ReplicaSync> replicas_;
  std::unique_ptr<AdaScale> adascale_;  // when plan.adascale
  std::unique_ptr<OffloadModel> offload_model_;  // when plan.offload_model.enabled: its own schedule
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<pieces::Batches> batches_;  // the data loader
};

Executor::Executor(zoo::Model& model, const Plan& plan, Communicator& comm, Device& device, Recorder& recorder,
                   const ExecOptions& options)
    : impl_(std::make_unique<Impl>(model, plan, comm, device, recorder, options)) {}
Executor::~Executor() = default;
StepStats Executor::step(std::int64_t step) { return impl_->step(step); }
std::vector<std::pair<std::string, torch::Tensor>> Executor::full_parameters() { return impl_->full_parameters(); }
void Executor::save_checkpoint(const std::string& dir, std::int64_t step) { impl_->save_checkpoint(dir, step); }
std::int64_t Executor::load_checkpoint(const std::string& dir, bool other_run) {
  return impl_->load_checkpoint(dir, other_run);
}
std::int64_t Executor::optimizer_shard_numel() const { return impl_->optimizer_shard_numel(); }
int Executor::all_reduce_buckets() const { return impl_->all_reduce_buckets(); }
int Executor::units_with_params() const { return impl_->units_with_params(); }
bool Executor::views_valid() const { return impl_->views_valid(); }
std::vector<OffloadedActivations> Executor::offloaded_activations() const { return impl_->offloaded_activations(); }
LossScaler& Executor::loss_scaler() { return impl_->loss_scaler(); }
int Executor::first_unit() const { return impl_->first_unit(); }
int Executor::pipeline_stage() const { return impl_->pipeline_stage(); }

}  // namespace zeroplan::exec
