// Pipeline stages on ranks (the simulator's sim/src/lowering/pipeline.cpp). Ranks are stage-major:
// rank = stage x dp + replica (DeepSpeed's and Megatron's layout, the simulator's); the stage's
// data-parallel group is its dp consecutive ranks and runs ZeRO stages 0-2 over the stage's units as a
// plain run would. The step driver runs profiles' pipeline_order (gpipe or 1f1b) and asks this piece for
// the stage's input, where its output and gradients go, which microbatches are checkpointed
// (pipeline_checkpointed: the whole stage keeps its input only and recomputes before the backward) and
// the loss, which only the last stage computes and sends to the others.
// Sends are rendezvous (Gloo moves the data when the receiver asks) and never block the schedule: an
// activation's send is released once a gradient came back whose backward the next stage orders after that
// activation's forward, a gradient's when the next one is sent, the rest at the end of the step. The
// simulator allocates received buffers when the receiver asks and holds a sent gradient as long.
// Tied weights across stages (the GPT head's use of the token embedding): the borrowing stage keeps a
// replica as its own parameter (its gradient and optimizer state, as the simulator counts); its gradient
// goes to the owner, which adds it to its own before reducing (ZeRO 0-1: once, accumulated over the
// microbatches; ZeRO 2, which reduces every microbatch: every microbatch, one copy in flight), and the
// owner's updated weight is copied into the replica after every step: one weight, one update.
#include "pieces.h"
#include "strformat.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/exec/local_communicator.h"

namespace zeroplan::exec::pieces {

namespace {
enum TagKind { kActHeader = 1, kAct = 2, kGrad = 3, kTiedGrad = 4, kTiedParam = 5, kLoss = 6 };
constexpr int kHeader = 10;  // ndim, dtype, up to 8 dims
}  // namespace

Pipeline::Pipeline(const Plan& plan, int model_units, Communicator& world) : plan_(plan), world_(world) {
  stages_ = plan.pipeline_stages;
  dp_size_ = plan.data_parallel_size();
  stage_ = world.rank() / dp_size_;
  replica_ = world.rank() % dp_size_;
  if (stages_ <= 1) {
    dp_ = &world;
    order_ = pipeline_order("gpipe", 1, 0, plan.microbatches);
    balance_ = {model_units};
    first_ = {0};
    return;
  }
  if (plan.pipeline.balance.mode != PipelineBalance::Mode::units) {
    throw ExecError(detail::format("pipeline_stages {}: the executor needs pipeline.balance as units per stage (a "
                                   "time or memory balance needs the model's profile: zeroplan run --profile FILE, or "
                                   "--set pipeline.balance=[n0,n1,...])",
                                   stages_));
  }
  balance_ = plan.pipeline.balance.units;
  int sum = 0;
  for (const int b : balance_) {
    first_.push_back(sum);
    sum += b;
  }
  if (static_cast<int>(balance_.size()) != stages_ || sum != model_units) {
    throw ExecError(detail::format("pipeline.balance has {} stages over {} units; the plan has {} stages and the model {} units",
                                   balance_.size(), sum, stages_, model_units));
  }
  order_ = pipeline_order(plan.pipeline.schedule, stages_, stage_, plan.microbatches);
  // One replica: no data-parallel group to form (a local communicator, as a single process runs).
  if (dp_size_ == 1) {
    dp_own_ = std::make_unique<LocalCommunicator>();
  } else {
    dp_own_ = world.split(dp_size_);
  }
  dp_ = dp_own_.get();
  sent_shape_.resize(static_cast<std::size_t>(plan.microbatches));
  sent_dtype_.assign(static_cast<std::size_t>(plan.microbatches), torch::kFloat32);
  act_sends_.resize(static_cast<std::size_t>(plan.microbatches));
}

StageUnits Pipeline::units() const {
  return {first_[static_cast<std::size_t>(stage_)], balance_[static_cast<std::size_t>(stage_)], stage_ > 0};
}

int Pipeline::stage_of(int unit) const {
  int s = 0;
  while (s + 1 < stages_ && first_[static_cast<std::size_t>(s + 1)] <= unit) ++s;
  return s;
}

void Pipeline::attach(Ctx& c, const zoo::Model& model) {
  c_ = &c;
  if (stages_ <= 1) return;
  c.world_comm = &world_;
  // Every cross-stage tie of the model, numbered in model order (both sides number them alike).
  int k = 0;
  for (int b = 0; b < static_cast<int>(model.units.size()); ++b) {
    for (const auto& borrowed : model.units[static_cast<std::size_t>(b)].borrowed) {
      const int o = borrowed.owner_unit;
      if (stage_of(o) == stage_of(b)) continue;
      if (stage_of(b) == stage_) {
        const UnitRT& U = c.unit(b - c.first_unit);
        for (const TiedReplica& r : U.replicas)
          if (r.owner == o && r.owner_name == borrowed.owner_name) ties_.push_back({b - c.first_unit, r.offset, r.numel, stage_of(o), k, false});
      } else if (stage_of(o) == stage_) {
        const UnitRT& U = c.unit(o - c.first_unit);
        const ParamSlot* slot = U.flat.find(borrowed.owner_name);
        if (slot == nullptr) throw ExecError("tied weight " + borrowed.owner_name + " not in unit " + U.name);
        ties_.push_back({o - c.first_unit, slot->offset, slot->numel, stage_of(b), k, true});
      }
      ++k;
    }
  }
}

// A receive, on the trace's comm lane and in the step's "pipeline_wait" phase: how long this stage waited.
void Pipeline::waited(const char* what, double t0_s, int mb) {
  c_->rec.span(Lane::comm, what, t0_s, c_->rec.now_s(), "pipeline_wait", -1, mb);
}

torch::Tensor Pipeline::recv_input(int mb) {
  c_->cur_phase = "recv activations";
  const double t0 = c_->rec.now_s();
  torch::Tensor header = torch::empty({kHeader}, torch::kInt64);
  world_.recv(header, peer(stage_ - 1), tag(kActHeader, mb))->wait();
  const auto* h = header.data_ptr<std::int64_t>();
  std::vector<std::int64_t> shape(h + 2, h + 2 + h[0]);
  torch::Tensor x = torch::empty(shape, torch::TensorOptions().dtype(static_cast<torch::ScalarType>(h[1])).device(c_->dev.torch_device()));
  world_.recv(x, peer(stage_ - 1), tag(kAct, mb))->wait();
  waited("recv activations", t0, mb);
  return x;
}

void Pipeline::send_output(int mb, const torch::Tensor& y) {
  c_->cur_phase = "send activations";
  TORCH_CHECK(y.dim() <= kHeader - 2, "a stage's output has ", y.dim(), " dimensions, at most ", kHeader - 2, " travel");
  torch::Tensor header = torch::zeros({kHeader}, torch::kInt64);
  auto* h = header.data_ptr<std::int64_t>();
  h[0] = y.dim();
  h[1] = static_cast<std::int64_t>(y.scalar_type());
  for (int i = 0; i < y.dim(); ++i) h[2 + i] = y.size(i);
  const auto j = static_cast<std::size_t>(mb);
  sent_shape_[j] = y.sizes().vec();
  sent_dtype_[j] = y.scalar_type();
  other_sends_.push_back(world_.send(header, peer(stage_ + 1), tag(kActHeader, mb)));
  other_sent_.push_back(header);
  act_sends_[j] = world_.send(y.contiguous(), peer(stage_ + 1), tag(kAct, mb));
}

torch::Tensor Pipeline::recv_grad(int mb) {
  c_->cur_phase = "recv gradients";
  const auto j = static_cast<std::size_t>(mb);
  torch::Tensor g = torch::empty(sent_shape_[j], torch::TensorOptions().dtype(sent_dtype_[j]).device(c_->dev.torch_device()));
  const double t0 = c_->rec.now_s();
  world_.recv(g, peer(stage_ + 1), tag(kGrad, mb))->wait();
  waited("recv gradients", t0, mb);
  // The next stage ran every forward it orders before this backward: those activations' sends are done
  // (waiting returns at once), and their buffers go now, not at the end of the step.
  for (const PipelineOp& op : pipeline_order(plan_.pipeline.schedule, stages_, stage_ + 1, plan_.microbatches)) {
    if (!op.forward && op.microbatch == mb) break;
    auto& w = act_sends_[static_cast<std::size_t>(op.microbatch)];
    if (op.forward && w) {
      w->wait();
      w.reset();
    }
  }
  return g;
}

void Pipeline::send_grad(int mb, const torch::Tensor& g) {
  c_->cur_phase = "send gradients";
  if (grad_send_) grad_send_->wait();
  grad_sent_ = g.contiguous();
  grad_send_ = world_.send(grad_sent_, peer(stage_ - 1), tag(kGrad, mb));
  // Stage 2: this microbatch's tied-weight gradient reaches its owner once the stages before have run
  // their backward of it (they have every gradient they need): its copy goes now.
  if (tied_send_) {
    tied_send_->wait();
    tied_send_.reset();
    tied_sent_ = torch::Tensor();
  }
}

// Stages 0-1 accumulate the replica's gradient over the microbatches where it lies (the full gradient
// buffer) and send it once, after the last microbatch's backward of the borrower (after every forward of
// the stage: no microbatch's activations wait beside the copy); the owner adds it before its last
// microbatch's reduction. Stage 2 reduces every microbatch: each microbatch's gradient goes, at most one
// in flight.
bool Pipeline::tied_due(bool last_micro) const { return plan_.zero_stage >= 2 || last_micro; }

void Pipeline::tied_grads_out(int u, GradSync& grads, bool last_micro) {
  for (const Tie& t : ties_) {
    if (t.owner || t.local_unit != u || !tied_due(last_micro)) continue;
    torch::NoGradGuard no_grad;
    if (tied_send_) tied_send_->wait();
    torch::Tensor g = grads.region(u).narrow(0, t.offset, t.numel);
    tied_sent_ = g.clone();
    g.zero_();
    tied_send_ = world_.send(tied_sent_, peer(t.other_stage), tag(kTiedGrad, 0, t.k));
  }
}

void Pipeline::tied_grads_in(int u, GradSync& grads, bool last_micro) {
  for (const Tie& t : ties_) {
    if (!t.owner || t.local_unit != u || !tied_due(last_micro)) continue;
    torch::NoGradGuard no_grad;
    c_->cur_phase = "recv tied gradients";
    torch::Tensor g = grads.region(u).narrow(0, t.offset, t.numel);
    torch::Tensor in = torch::empty_like(g);
    const double t0 = c_->rec.now_s();
    world_.recv(in, peer(t.other_stage), tag(kTiedGrad, 0, t.k))->wait();
    waited("recv tied gradients", t0);
    g.add_(in);
  }
}

void Pipeline::tied_params_after_step(ParamResidency& params) {
  for (const Tie& t : ties_) {
    torch::NoGradGuard no_grad;
    c_->at(c_->unit(t.local_unit).name, "tied weights");
    torch::Tensor w = params.flat().narrow(0, c_->unit(t.local_unit).base + t.offset, t.numel);
    if (t.owner) {
      other_sends_.push_back(world_.send(w, peer(t.other_stage), tag(kTiedParam, 0, t.k)));
    } else {
      const double t0 = c_->rec.now_s();
      world_.recv(w, peer(t.other_stage), tag(kTiedParam, 0, t.k))->wait();
      waited("recv tied weights", t0);
    }
  }
}

double Pipeline::share_loss(double loss) {
  if (stages_ <= 1) return loss;
  c_->at("all", "loss");
  torch::Tensor t = torch::full({1}, loss, torch::kFloat64);
  if (last()) {
    for (int s = 0; s + 1 < stages_; ++s) {
      other_sends_.push_back(world_.send(t, peer(s), tag(kLoss, 0)));
      other_sent_.push_back(t);
    }
    return loss;
  }
  const double t0 = c_->rec.now_s();
  world_.recv(t, peer(stages_ - 1), tag(kLoss, 0))->wait();
  waited("recv loss", t0);
  return t.item<double>();
}

void Pipeline::finish_step() {
  c_->at("all", "pipeline sends");
  for (auto& w : act_sends_)
    if (w) w->wait(), w.reset();
  if (grad_send_) grad_send_->wait();
  grad_send_.reset();
  grad_sent_ = torch::Tensor();
  if (tied_send_) tied_send_->wait();
  tied_send_.reset();
  tied_sent_ = torch::Tensor();
  for (auto& w : other_sends_) w->wait();
  other_sends_.clear();
  other_sent_.clear();
}

}  // namespace zeroplan::exec::pieces
