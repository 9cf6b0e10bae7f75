#include "zeroplan/exec/executor.h"

#include "strformat.h"

#include <algorithm>
#include <deque>
#include <functional>

#include "comm_tracker.h"
#include "zeroplan/exec/flat_params.h"
#include "zeroplan/exec/optimizer.h"
#include "zeroplan/profiles/knobs.h"

namespace zeroplan::exec {

OutOfDeviceMemory::OutOfDeviceMemory(std::string unit, std::string phase, std::int64_t need_bytes,
                                     std::int64_t limit_bytes)
    : ExecError(detail::format("out of device memory in unit {}, phase {}: need {} bytes, limit {}", unit, phase,
                            need_bytes, limit_bytes)),
      unit_(std::move(unit)),
      phase_(std::move(phase)),
      need_bytes_(need_bytes),
      limit_bytes_(limit_bytes) {}

// What the knob registry marks as not run (Support::no) and the plan uses: "pipeline_stages 2", ...
std::vector<std::string> unsupported_features(const Plan& p) { return unsupported_knobs(p, Component::run); }

// Named (not anonymous): Executor::Impl holds these, and in a unity build this file is not the main file.
namespace executor_detail {

struct Borrow {
  int owner = 0;
  std::int64_t offset = 0;  // in the owner's flat buffer
  std::int64_t numel = 0;
  torch::Tensor param;      // the owner's parameter (the tensor the borrower uses)
};

struct UnitRT {
  std::string name;
  std::shared_ptr<zoo::UnitModule> module;
  FlatParams flat;
  std::vector<Borrow> borrows;
  ShardLayout layout;
  std::int64_t base = 0;        // region in flat_all_/grad_all_ (stages 0-2)
  std::int64_t shard_base = 0;  // region of this rank's shard buffers
  bool checkpoint = false;
  bool pinned = false;          // stage 3: stays gathered from forward to its backward
  torch::Tensor full;           // full (padded) flat params; stage 3: storage freed when resharded
  bool gathered = true;
  CommTracker::Handle gather;   // stage 3: all-gather in flight
  torch::Tensor gather_src;
  // One microbatch's activations.
  torch::Tensor in, out, rng;
  torch::Tensor grad_full;      // stages 2-3: this microbatch's full gradient, until reduce-scattered

  std::int64_t numel() const { return flat.numel(); }
  std::int64_t shard() const { return layout.shard_numel; }
};

struct Bucket {
  int lo = 0, hi = 0;  // units [lo, hi], launched when unit lo finished backward
  std::int64_t offset = 0, numel = 0;
};

struct PendingReduce {
  int unit;
  CommTracker::Handle handle;
  torch::Tensor input, output;
};

}  // namespace executor_detail
using namespace executor_detail;

class Executor::Impl {
 public:
  Impl(zoo::Model& model, const Plan& plan, Communicator& comm, Device& dev, Recorder& rec)
      : model_(model), plan_(plan), comm_(comm), dev_(dev), rec_(rec), tracker_(rec) {
    rank_ = comm.rank();
    world_ = comm.world_size();
    stage_ = plan.zero_stage;
    if (auto u = unsupported_features(plan); !u.empty()) {
      std::string list;
      for (const auto& s : u) list += (list.empty() ? "" : ", ") + s;
      throw ExecError("the executor does not run: " + list);
    }
    if (plan.world_size != world_) {
      throw ExecError(detail::format("plan world_size {} != {} ranks running it", plan.world_size, world_));
    }
    if (plan.global_batch != plan.micro_batch * plan.microbatches * plan.world_size) {
      throw ExecError(detail::format("plan: global_batch {} != micro_batch {} x microbatches {} x world_size {} (= {})",
                                  plan.global_batch, plan.micro_batch, plan.microbatches, plan.world_size,
                                  plan.micro_batch * plan.microbatches * plan.world_size));
    }
    if (stage_ < 0 || stage_ > 3) throw ExecError(detail::format("plan: zero_stage {} not in 0..3", stage_));
    if (plan.offload.params && stage_ != 3) throw ExecError("plan: offload.params requires zero_stage 3");
    if (plan.offload.optimizer && stage_ < 1) throw ExecError("plan: offload.optimizer requires zero_stage >= 1");
    if (plan.offload.grads && !plan.offload.optimizer) throw ExecError("plan: offload.grads requires offload.optimizer");
    if (model.units.empty()) throw ExecError("model " + model.name + " has no units");
    guarded([&] { setup(); });
  }

  StepStats step(std::int64_t step) {
    StepStats stats;
    guarded([&] { stats = run_step(step); });
    return stats;
  }

  std::vector<std::pair<std::string, torch::Tensor>> full_parameters() {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    guarded([&] {
      torch::NoGradGuard no_grad;
      for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
        UnitRT& U = units_[static_cast<std::size_t>(u)];
        cur_unit_ = U.name;
        cur_phase_ = "gather_parameters";
        const bool was = U.gathered;
        if (stage_ == 3) ensure_gathered(u, -1);
        for (const auto& s : U.flat.slots()) out.emplace_back(U.name + "." + s.name, s.param.detach().clone());
        if (stage_ == 3 && !was) release(u);
      }
    });
    return out;
  }

  std::int64_t optimizer_shard_numel() const { return shard_total_; }
  int all_reduce_buckets() const { return static_cast<int>(buckets_.size()); }
  int units_with_params() const {
    return static_cast<int>(std::count_if(units_.begin(), units_.end(), [](const UnitRT& u) { return u.numel() > 0; }));
  }
  bool views_valid() const {
    for (const auto& U : units_) {
      if (U.numel() == 0) continue;
      if (stage_ == 3 && !U.gathered) {
        for (const auto& s : U.flat.slots()) {
          if (!s.param.storage().is_alias_of(U.full.storage())) return false;
        }
        continue;
      }
      if (!U.flat.views_valid(U.full)) return false;
    }
    return true;
  }

 private:
  // Runs f; a refused device allocation becomes OutOfDeviceMemory, any other torch error UnitFailure,
  // both naming the unit and phase (torch's own cause in one line, never its backtrace).
  template <typename F>
  void guarded(F&& f) {
    try {
      f();
    } catch (const ExecError&) {
      throw;
    } catch (const std::exception& e) {
      DeviceRefusal r;
      if (dev_.is_out_of_memory(e, &r)) throw OutOfDeviceMemory(cur_unit_, cur_phase_, r.need_bytes, r.limit_bytes);
      if (dynamic_cast<const c10::Error*>(&e) == nullptr) throw;
      throw UnitFailure(detail::format("unit {}, phase {} (micro batch {}): torch: {}", cur_unit_, cur_phase_,
                                       plan_.micro_batch, zoo::torch_cause(e)));
    }
  }

  torch::Tensor dzeros(std::int64_t n) { return torch::zeros({n}, torch::TensorOptions().device(dev_.torch_device())); }
  torch::Tensor dempty(std::int64_t n) { return torch::empty({n}, torch::TensorOptions().device(dev_.torch_device())); }
  torch::Tensor hzeros(std::int64_t n) { return dev_.host_pool().zeros(n); }

  bool sharded() const { return stage_ >= 1; }
  bool host_optimizer() const { return plan_.offload.optimizer; }
  // Stage 3: the master shard is shard_all_ itself unless it lives on the device while the optimizer
  // runs on the host.
  bool separate_master() const { return host_optimizer() && !(stage_ == 3 && plan_.offload.params); }

  void setup() {
    torch::NoGradGuard no_grad;
    cur_phase_ = "setup";
    const int ns = sharded() ? world_ : 1;
    units_.resize(model_.units.size());
    std::int64_t base = 0, shard_base = 0;
    for (std::size_t u = 0; u < model_.units.size(); ++u) {
      const zoo::Unit& src = model_.units[u];
      UnitRT& U = units_[u];
      U.name = src.name;
      U.module = src.module;
      std::vector<std::pair<std::string, torch::Tensor>> named;
      for (const auto& item : src.module->named_parameters(/*recurse=*/true)) named.emplace_back(item.key(), item.value());
      U.flat = FlatParams(named);
      U.layout = make_shard_layout(U.flat.numel(), ns);
      U.base = base;
      U.shard_base = shard_base;
      base += U.layout.padded_numel();
      shard_base += U.layout.shard_numel;
      U.checkpoint = plan_.checkpointing.applies_to(static_cast<int>(u));
      U.pinned = (u == 0);
      for (const auto& b : src.borrowed) {
        if (b.owner_unit < 0 || b.owner_unit >= static_cast<int>(u)) {
          throw ExecError(detail::format("unit {} borrows from unit {}, which does not come before it", src.name, b.owner_unit));
        }
        const ParamSlot* slot = units_[static_cast<std::size_t>(b.owner_unit)].flat.find(b.owner_name);
        if (slot == nullptr) {
          throw ExecError(detail::format("unit {} borrows {} from unit {}, which has no such parameter", src.name,
                                      b.owner_name, b.owner_unit));
        }
        U.borrows.push_back({b.owner_unit, slot->offset, slot->numel, slot->param});
        units_[static_cast<std::size_t>(b.owner_unit)].pinned = true;
      }
    }
    shard_total_ = shard_base;

    if (stage_ < 3) {
      flat_all_ = dzeros(base);
      for (auto& U : units_) {
        cur_unit_ = U.name;
        U.full = flat_all_.narrow(0, U.base, U.layout.padded_numel());
        U.flat.copy_into(U.full);
        U.flat.bind(U.full);
      }
    } else {
      shard_all_ = plan_.offload.params ? hzeros(shard_total_) : dzeros(shard_total_);
      for (auto& U : units_) {
        cur_unit_ = U.name;
        U.full = dzeros(U.layout.padded_numel());
        U.flat.copy_into(U.full);
        U.flat.bind(U.full);
        shard_all_.narrow(0, U.shard_base, U.shard()).copy_(U.full.narrow(0, U.layout.shard_begin(rank_), U.shard()));
        if (U.numel() > 0) {
          free_storage(U.full);
          U.gathered = false;
        }
      }
    }
    cur_unit_ = "all";
    if (stage_ <= 1) grad_all_ = dzeros(base);
    if (stage_ >= 2) grad_shard_all_ = plan_.offload.grads ? hzeros(shard_total_) : dzeros(shard_total_);
    if (separate_master()) {
      master_host_ = hzeros(shard_total_);
      for (const auto& U : units_) {
        master_host_.narrow(0, U.shard_base, U.shard()).copy_(my_param_chunk(U));
      }
    }
    if (host_optimizer() && (stage_ == 1 || !plan_.offload.grads)) host_grad_ = hzeros(shard_total_);
    if (stage_ >= 2 && plan_.offload.grads) {
      std::int64_t max_shard = 0;
      for (const auto& U : units_) max_shard = std::max(max_shard, U.shard());
      host_scratch_ = hzeros(max_shard);
    }

    std::vector<std::int64_t> segments;
    if (stage_ == 0) {
      segments.push_back(base);
    } else if (stage_ == 3 || host_optimizer()) {
      segments.push_back(shard_total_);
    } else {
      for (const auto& U : units_) segments.push_back(U.shard());
    }
    std::function<torch::Tensor(std::int64_t)> alloc = [this](std::int64_t n) {
      return host_optimizer() ? hzeros(n) : dzeros(n);
    };
    optimizer_ = std::make_unique<FlatOptimizer>(plan_.optimizer, segments, alloc);
    if (stage_ == 0) shard_total_ = base;

    if (stage_ <= 1) {
      // Buckets in reverse unit order, closed once they reach the cap (DDP: bucket_cap_mb).
      const std::int64_t cap = std::max<std::int64_t>(plan_.buckets.all_reduce_bucket_bytes / 4, 1);
      Bucket cur;
      cur.hi = static_cast<int>(units_.size()) - 1;
      for (int u = static_cast<int>(units_.size()) - 1; u >= 0; --u) {
        const UnitRT& U = units_[static_cast<std::size_t>(u)];
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
  }

  // This rank's chunk of the unit's current full parameters (stages 1-2: a view of flat_all_;
  // stage 3: of shard_all_).
  torch::Tensor my_param_chunk(const UnitRT& U) {
    if (stage_ == 3) return shard_all_.narrow(0, U.shard_base, U.shard());
    return flat_all_.narrow(0, U.base + U.layout.shard_begin(rank_), U.shard());
  }

  // ---- stage 3 parameter residency ----

  void start_gather(int u, int micro) {
    UnitRT& U = units_[static_cast<std::size_t>(u)];
    if (U.gathered || U.gather || U.numel() == 0) return;
    realloc_storage(U.full);
    torch::Tensor src = shard_all_.narrow(0, U.shard_base, U.shard());
    if (plan_.offload.params) {
      // The offloaded shard comes back straight into this rank's chunk of the full buffer, and the
      // all-gather runs in place: no device copy of the shard besides.
      const double t0 = rec_.now_s();
      torch::Tensor mine = U.full.narrow(0, U.layout.shard_begin(rank_), U.shard());
      dev_.copy_h2d(mine, src);
      dev_.wait_copies();
      rec_.span(Lane::h2d, "h2d params " + U.name, t0, rec_.now_s(), "h2d", u, micro);
      src = mine;
    }
    U.gather_src = src;
    const double t = rec_.now_s();
    torch::Tensor out = U.full;
    U.gather = tracker_.issue(comm_.all_gather(out, src), t, "all_gather " + U.name, "all_gather", u, micro);
  }

  void ensure_gathered(int u, int micro) {
    UnitRT& U = units_[static_cast<std::size_t>(u)];
    if (U.gathered || U.numel() == 0) return;
    start_gather(u, micro);
    tracker_.wait(U.gather);
    U.gather.reset();
    U.gather_src = torch::Tensor();
    U.gathered = true;
  }

  // Stage 3, before unit u runs (forward or backward): u and the owners of the weights it borrows
  // gathered; with prefetch, the gather of `next` (the unit that runs after it; -1: none) started.
  void gather_for(int u, int micro, int next) {
    ensure_gathered(u, micro);
    for (const auto& b : units_[static_cast<std::size_t>(u)].borrows) ensure_gathered(b.owner, micro);
    if (plan_.buckets.prefetch && next >= 0) start_gather(next, micro);
  }

  void release(int u) {
    UnitRT& U = units_[static_cast<std::size_t>(u)];
    if (!U.gathered || U.numel() == 0) return;
    free_storage(U.full);
    U.gathered = false;
  }

  // ---- gradients ----

  // Where unit `owner`'s gradient accumulates this microbatch: its region of grad_all_ (stages 0-1)
  // or its transient full gradient (stages 2-3).
  torch::Tensor grad_region(int owner) {
    UnitRT& U = units_[static_cast<std::size_t>(owner)];
    if (stage_ <= 1) return grad_all_.narrow(0, U.base, U.layout.padded_numel());
    if (!U.grad_full.defined()) U.grad_full = dzeros(U.layout.padded_numel());
    return U.grad_full;
  }

  void launch_reduce_scatter(int u, int micro) {
    UnitRT& U = units_[static_cast<std::size_t>(u)];
    if (U.numel() == 0) return;
    cur_phase_ = "reduce_scatter";
    torch::Tensor input = grad_region(u);
    torch::Tensor output = dempty(U.shard());
    const double t = rec_.now_s();
    auto h = tracker_.issue(comm_.reduce_scatter(output, input, ReduceOp::kSum), t, "reduce_scatter " + U.name,
                            "reduce_scatter", u, micro);
    U.grad_full = torch::Tensor();
    pending_.push_back({u, h, input, output});
  }

  // Waits pending reduce-scatters (all but the newest `keep`) and adds them to the gradient shard.
  void drain_reduces(std::size_t keep) {
    while (pending_.size() > keep) {
      PendingReduce p = std::move(pending_.front());
      pending_.pop_front();
      const UnitRT& U = units_[static_cast<std::size_t>(p.unit)];
      cur_unit_ = U.name;
      cur_phase_ = "reduce_scatter";
      tracker_.wait(p.handle);
      torch::Tensor dst = grad_shard_all_.narrow(0, U.shard_base, U.shard());
      if (plan_.offload.grads) {
        const double t0 = rec_.now_s();
        torch::Tensor scratch = host_scratch_.narrow(0, 0, U.shard());
        dev_.copy_d2h(scratch, p.output);
        dev_.wait_copies();
        dst.add_(scratch);
        rec_.span(Lane::d2h, "d2h grads " + U.name, t0, rec_.now_s(), "d2h", p.unit);
      } else {
        dst.add_(p.output);
      }
    }
  }

  // ---- the step ----

  torch::Tensor forward(const torch::Tensor& input, int micro) {
    torch::Tensor x = input;
    const int n = static_cast<int>(units_.size());
    for (int u = 0; u < n; ++u) {
      UnitRT& U = units_[static_cast<std::size_t>(u)];
      cur_unit_ = U.name;
      cur_phase_ = "forward";
      if (stage_ == 3) gather_for(u, micro, u + 1 < n ? u + 1 : -1);
      const double t0 = rec_.now_s();
      torch::Tensor in = (u > 0 && x.is_floating_point()) ? x.detach().requires_grad_(true) : x;
      torch::Tensor out;
      if (U.checkpoint) {
        U.rng = dev_.rng_state();
        torch::NoGradGuard no_grad;
        out = U.module->forward(in);
      } else {
        out = U.module->forward(in);
      }
      dev_.synchronize();
      rec_.span(Lane::compute, "forward " + U.name, t0, rec_.now_s(), "forward", u, micro);
      U.in = in;
      U.out = U.checkpoint ? torch::Tensor() : out;
      x = out.detach();
      if (stage_ == 3 && plan_.reshard_after_forward && !U.pinned) release(u);
    }
    return x;
  }

  void backward(torch::Tensor grad, int micro, bool sync) {
    const int n = static_cast<int>(units_.size());
    for (int u = n - 1; u >= 0; --u) {
      UnitRT& U = units_[static_cast<std::size_t>(u)];
      cur_unit_ = U.name;
      cur_phase_ = "backward";
      if (stage_ == 3) gather_for(u, micro, u - 1);
      torch::Tensor out = U.out;
      std::vector<torch::Tensor> kept_buffers;
      if (U.checkpoint) {
        cur_phase_ = "recompute";
        const double t0 = rec_.now_s();
        torch::Tensor now_state = dev_.rng_state();
        dev_.set_rng_state(U.rng);
        // The recompute must not update BatchNorm's running statistics a second time: they are put
        // back once the unit's backward has run (the recompute's graph holds them until then).
        for (const auto& b : U.module->buffers()) kept_buffers.push_back(b.clone());
        out = U.module->forward(U.in);
        dev_.set_rng_state(now_state);
        dev_.synchronize();
        rec_.span(Lane::compute, "recompute " + U.name, t0, rec_.now_s(), "recompute", u, micro);
        cur_phase_ = "backward";
      }
      const double t0 = rec_.now_s();
      std::vector<torch::Tensor> inputs;
      const bool input_grad = U.in.requires_grad();
      if (input_grad) inputs.push_back(U.in);
      for (const auto& s : U.flat.slots()) inputs.push_back(s.param);
      for (const auto& b : U.borrows) inputs.push_back(b.param);
      std::vector<torch::Tensor> grads;
      if (!inputs.empty() && grad.defined() && out.requires_grad()) {
        grads = torch::autograd::grad({out}, inputs, {grad}, /*retain_graph=*/false, /*create_graph=*/false,
                                      /*allow_unused=*/true);
      } else {
        grads.assign(inputs.size(), torch::Tensor());
      }
      {
        torch::NoGradGuard no_grad;
        std::size_t i = input_grad ? 1 : 0;
        torch::Tensor own = U.numel() > 0 ? grad_region(u) : torch::Tensor();
        for (const auto& s : U.flat.slots()) {
          const torch::Tensor& g = grads[i++];
          if (g.defined()) own.narrow(0, s.offset, s.numel).add_(g.reshape({-1}));
        }
        for (const auto& b : U.borrows) {
          const torch::Tensor& g = grads[i++];
          if (g.defined()) grad_region(b.owner).narrow(0, b.offset, b.numel).add_(g.reshape({-1}));
        }
      }
      if (input_grad) grad = grads[0].defined() ? grads[0] : torch::zeros_like(U.in);
      else grad = torch::Tensor();
      grads.clear();
      if (!kept_buffers.empty()) {
        torch::NoGradGuard no_grad;
        std::size_t i = 0;
        for (auto& b : U.module->buffers()) b.copy_(kept_buffers[i++]);
        kept_buffers.clear();
      }
      U.in = U.out = U.rng = torch::Tensor();
      out = torch::Tensor();
      dev_.synchronize();
      rec_.span(Lane::compute, "backward " + U.name, t0, rec_.now_s(), "backward", u, micro);

      if (stage_ <= 1) {
        if (sync) {
          for (const Bucket& b : buckets_) {
            if (b.lo != u) continue;
            cur_phase_ = "all_reduce";
            torch::Tensor view = grad_all_.narrow(0, b.offset, b.numel);
            const double t = rec_.now_s();
            reduces_.push_back(tracker_.issue(comm_.all_reduce(view, ReduceOp::kSum), t,
                                              detail::format("all_reduce units {}-{}", b.lo, b.hi), "all_reduce", u, micro));
          }
        }
      } else {
        launch_reduce_scatter(u, micro);
        drain_reduces(1);
      }
      if (stage_ == 3) release(u);
    }
  }

  StepStats run_step(std::int64_t step) {
    const double t_step = rec_.now_s();
    const int m = plan_.microbatches;
    const std::int64_t mb = plan_.micro_batch;
    {
      torch::NoGradGuard no_grad;
      cur_unit_ = "all";
      cur_phase_ = "zero_grad";
      if (grad_all_.defined()) grad_all_.zero_();
      if (grad_shard_all_.defined()) grad_shard_all_.zero_();
    }
    double loss_sum = 0;
    const double scale = 1.0 / (static_cast<double>(world_) * m);
    for (int k = 0; k < m; ++k) {
      cur_unit_ = "all";
      cur_phase_ = "data";
      zoo::Batch batch = model_.task->batch(step, (static_cast<std::int64_t>(rank_) * m + k) * mb, mb);
      torch::Tensor input = batch.input.to(dev_.torch_device());
      torch::Tensor target = batch.target.to(dev_.torch_device());
      torch::Tensor last = forward(input, k);
      cur_unit_ = units_.back().name;
      cur_phase_ = "loss";
      const double t0 = rec_.now_s();
      torch::Tensor z = last.detach().requires_grad_(true);
      last = torch::Tensor();  // the last unit's graph keeps its output while it needs it, not the loop
      torch::Tensor loss = model_.task->loss(z, target);
      loss_sum += loss.item<double>();
      torch::Tensor gz = torch::autograd::grad({loss}, {z}, {torch::full({}, scale, loss.options())})[0];
      // The loss and its gradient are the last unit's forward, as the profiler measures that unit.
      rec_.span(Lane::compute, "loss", t0, rec_.now_s(), "forward", static_cast<int>(units_.size()) - 1, k);
      z = loss = torch::Tensor();
      backward(gz, k, k == m - 1);
      // Like FSDP's end-of-backward callback: every reduce-scatter of this microbatch lands in the
      // gradient shard before the next microbatch, so its buffers are not carried into that forward.
      if (stage_ >= 2) drain_reduces(0);
    }
    cur_unit_ = "all";
    drain_reduces(0);
    cur_phase_ = "all_reduce";
    for (auto& h : reduces_) tracker_.wait(h);
    reduces_.clear();
    optimizer_step();
    dev_.synchronize();
    StepStats stats;
    stats.time_s = rec_.now_s() - t_step;
    stats.loss = loss_sum / m;
    stats.phase_s = rec_.end_step();
    return stats;
  }

  void optimizer_step() {
    torch::NoGradGuard no_grad;
    cur_unit_ = "all";
    cur_phase_ = "optimizer";
    std::vector<torch::Tensor> params, grads;
    if (stage_ == 0) {
      params.push_back(flat_all_);
      grads.push_back(grad_all_);
    } else if (host_optimizer()) {
      torch::Tensor host_grad = host_grad_.defined() ? host_grad_ : grad_shard_all_;
      if (host_grad_.defined()) {
        const double t0 = rec_.now_s();
        for (const auto& U : units_) {
          torch::Tensor src = stage_ == 1 ? grad_all_.narrow(0, U.base + U.layout.shard_begin(rank_), U.shard())
                                          : grad_shard_all_.narrow(0, U.shard_base, U.shard());
          dev_.copy_d2h(host_grad_.narrow(0, U.shard_base, U.shard()), src);
        }
        dev_.wait_copies();
        rec_.span(Lane::d2h, "d2h grads", t0, rec_.now_s(), "d2h");
      }
      params.push_back(separate_master() ? master_host_ : shard_all_);
      grads.push_back(host_grad);
    } else if (stage_ == 3 && plan_.offload.params) {
      // Parameters on the host, optimizer on the device: step a device copy of the shard.
      torch::Tensor p = dempty(shard_total_);
      const double t0 = rec_.now_s();
      dev_.copy_h2d(p, shard_all_);
      dev_.wait_copies();
      rec_.span(Lane::h2d, "h2d params", t0, rec_.now_s(), "h2d");
      params.push_back(p);
      grads.push_back(grad_shard_all_);
    } else if (stage_ == 3) {
      params.push_back(shard_all_);
      grads.push_back(grad_shard_all_);
    } else {
      for (const auto& U : units_) {
        params.push_back(my_param_chunk(U));
        grads.push_back(stage_ == 1 ? grad_all_.narrow(0, U.base + U.layout.shard_begin(rank_), U.shard())
                                    : grad_shard_all_.narrow(0, U.shard_base, U.shard()));
      }
    }
    const double t0 = rec_.now_s();
    optimizer_->step(params, grads);
    dev_.synchronize();
    rec_.span(host_optimizer() ? Lane::optimizer : Lane::compute, "optimizer", t0, rec_.now_s(), "optimizer");

    if (stage_ == 3 && plan_.offload.params && !host_optimizer()) {
      const double t1 = rec_.now_s();
      dev_.copy_d2h(shard_all_, params[0]);
      dev_.wait_copies();
      rec_.span(Lane::d2h, "d2h params", t1, rec_.now_s(), "d2h");
    }
    if (stage_ == 3 && separate_master()) {
      const double t1 = rec_.now_s();
      dev_.copy_h2d(shard_all_, master_host_);
      dev_.wait_copies();
      rec_.span(Lane::h2d, "h2d params", t1, rec_.now_s(), "h2d");
    }
    if (stage_ == 1 || stage_ == 2) {
      // Every rank's updated chunks back into everyone's full parameters.
      cur_phase_ = "all_gather";
      std::vector<CommTracker::Handle> works;
      for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
        UnitRT& U = units_[static_cast<std::size_t>(u)];
        if (U.numel() == 0) continue;
        cur_unit_ = U.name;
        torch::Tensor out = U.full;
        // In place (DeepSpeed's and FSDP's way): this rank's updated chunk is already its slot of the
        // output, so no copy of the shard is made; an offloaded optimizer's master comes back into it.
        torch::Tensor src = my_param_chunk(U);
        if (separate_master()) {
          const double t1 = rec_.now_s();
          dev_.copy_h2d(src, master_host_.narrow(0, U.shard_base, U.shard()));
          dev_.wait_copies();
          rec_.span(Lane::h2d, "h2d params " + U.name, t1, rec_.now_s(), "h2d", u);
        }
        const double t = rec_.now_s();
        works.push_back(tracker_.issue(comm_.all_gather(out, src), t, "all_gather " + U.name, "all_gather", u, -1));
      }
      for (auto& h : works) tracker_.wait(h);
    }
  }

  zoo::Model& model_;
  Plan plan_;
  Communicator& comm_;
  Device& dev_;
  Recorder& rec_;
  CommTracker tracker_;
  int rank_ = 0, world_ = 1, stage_ = 0;
  std::vector<UnitRT> units_;
  std::vector<Bucket> buckets_;
  std::string cur_unit_ = "all", cur_phase_ = "setup";
  std::int64_t shard_total_ = 0;
  torch::Tensor flat_all_, grad_all_;   // stages 0-2: full params; stages 0-1: full grads
  torch::Tensor shard_all_;             // stage 3: this rank's parameter shard (host with offload.params)
  torch::Tensor grad_shard_all_;        // stages 2-3: this rank's gradient shard (host with offload.grads)
  torch::Tensor master_host_;           // offload.optimizer: master shard on the host
  torch::Tensor host_grad_;             // offload.optimizer: host copy of the gradient shard for the step
  torch::Tensor host_scratch_;          // offload.grads: one unit's reduced shard on its way to the host
  std::unique_ptr<FlatOptimizer> optimizer_;
  std::deque<PendingReduce> pending_;
  std::vector<CommTracker::Handle> reduces_;
};

Executor::Executor(zoo::Model& model, const Plan& plan, Communicator& comm, Device& device, Recorder& recorder)
    : impl_(std::make_unique<Impl>(model, plan, comm, device, recorder)) {}
Executor::~Executor() = default;
StepStats Executor::step(std::int64_t step) { return impl_->step(step); }
std::vector<std::pair<std::string, torch::Tensor>> Executor::full_parameters() { return impl_->full_parameters(); }
std::int64_t Executor::optimizer_shard_numel() const { return impl_->optimizer_shard_numel(); }
int Executor::all_reduce_buckets() const { return impl_->all_reduce_buckets(); }
int Executor::units_with_params() const { return impl_->units_with_params(); }
bool Executor::views_valid() const { return impl_->views_valid(); }

}  // namespace zeroplan::exec
