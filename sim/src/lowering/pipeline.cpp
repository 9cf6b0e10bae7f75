// Pipeline parallelism (fairscale Pipe / GPipe, and 1F1B): each stage is a rank with its own compute
// stream, copy engines, channels and pools (a Ctx view over its units, pipeline_balance's split), and
// the pieces of step.cpp run on it once per microbatch. Activations go to the next stage and their
// gradients come back as point-to-point sends on the link between the two stages' devices. Ranks are
// stage-major (rank = stage x dp + replica, DeepSpeed's and Megatron's layout): a stage's data-parallel
// group is consecutive ranks, synchronised by dp_sync at its zero stage (0-2), and two stages share a
// node when every replica's pair of ranks does. The order on each stage's compute stream:
//   gpipe: F0 .. F(m-1), then B0 .. B(m-1). A checkpointed microbatch (checkpoint always: all;
//          except_last: all but the last) keeps only the stage's input in forward and recomputes the
//          stage's forward just before its backward;
//   1f1b:  (PipeDream-flush) min(p - s - 1, m) forwards, then a forward and a backward in turn, then
//          the backwards left: at most p - s microbatches in flight on stage s.
// The order and the checkpointed microbatches are profiles' pipeline_order and pipeline_checkpointed,
// which the executor's pipeline piece (exec/src/step/pipeline.cpp) runs too.
// The backward of a microbatch starts at the stage's last unit when its output's gradient has arrived.
// A weight tied across stages (the word embeddings of the first and last stage) has its replica's
// gradient sent to the owner before the owner's optimizer step, and the updated weight sent back after
// both steps (tie()).
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "context.h"
#include "zeroplan/profiles/pipeline.h"
#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim::lowering {

namespace {

// Whether every replica's ranks of stages s and t are on one node (stage-major ranks).
bool same_node(int s, int t, int dp, int devices_per_node) {
  for (int d = 0; d < dp; ++d)
    if ((s * dp + d) / devices_per_node != (t * dp + d) / devices_per_node) return false;
  return true;
}

// One stage: its view of the model and the pieces that act on it.
struct Stage {
  std::unique_ptr<Ctx> v;
  std::unique_ptr<ParamResidency> params;
  std::unique_ptr<GradSync> grads;
  std::vector<Activations> acts;            // one per microbatch: their activations live at once
  std::vector<TaskId> fwd_first, fwd_last;  // per microbatch: forward (or, checkpointed, its stage input) ends
  std::vector<TaskId> bwd_first, bwd_last;  // per microbatch: the first unit's and the last unit's backward
  std::vector<AllocId> kept_output;         // per microbatch: a checkpointed forward's output, until sent
  std::vector<std::pair<TaskId, int>> tied_copies;  // a replica's gradient copies to send: (copy, unit)
  TaskId tied_in = kNone;   // an owner of a lent weight: its replicas' gradients received (then the step)
  TaskId opt_end = kNone;   // the stage's last optimizer task
  PipelineStage out;
};

class Pipeline {
 public:
  explicit Pipeline(Ctx& c)
      : c_(c),
        p_(c.plan.pipeline_stages),
        m_(c.m),
        n_tied_(c.g.intern("tied gradient sent")),
        n_tied_in_(c.g.intern("received tied gradients")) {}

  std::vector<PipelineStage> run() {
    const std::vector<int> balance = pipeline_balance(c_.plan, c_.model);
    stages_.reserve(static_cast<std::size_t>(p_));
    int first = 0;
    for (int s = 0; s < p_; ++s) {
      Stage st;
      st.v = std::make_unique<Ctx>(c_, s, first, balance[static_cast<std::size_t>(s)]);
      Ctx& v = *st.v;
      build_resources(v);
      place_model_states(v);
      st.params = std::make_unique<ParamResidency>(v);
      st.grads = std::make_unique<GradSync>(v);
      st.acts.reserve(static_cast<std::size_t>(m_));
      for (int j = 0; j < m_; ++j) st.acts.emplace_back(v);
      for (auto* vec : {&st.fwd_first, &st.fwd_last, &st.bwd_first, &st.bwd_last}) vec->assign(static_cast<std::size_t>(m_), kNone);
      st.kept_output.assign(static_cast<std::size_t>(m_), kNone);
      st.out = {first, balance[static_cast<std::size_t>(s)], v.compute, v.dev, v.host, {}};
      first += balance[static_cast<std::size_t>(s)];
      stages_.push_back(std::move(st));
    }
    for (int s = 0; s < p_; ++s) {
      Stage& st = stages_[static_cast<std::size_t>(s)];
      zero_grads(*st.v);
      for (const PipelineOp& op : pipeline_order(c_.plan.pipeline.schedule, p_, s, m_))
        (op.forward ? forward(st, op.microbatch) : backward(st, op.microbatch));
      // An owner of a weight a later stage holds a replica of adds the replica's gradient (sent by tie())
      // before its optimizer step.
      if (lends(s)) {
        st.tied_in = st.v->g.add_task(st.v->compute, 0.0, st.v->label(n_tied_in_), {}, c_.n_cat_compute);
      }
      optimizer_step(*st.v, *st.grads);
      st.opt_end = st.v->last_compute;
      // The Prediction's unit timings (first microbatch), in the whole model's indices.
      for (std::size_t u = 0; u < st.v->units.size(); ++u) {
        c_.fwd0[st.out.first_unit + u] = st.v->fwd0[u];
        c_.bwd0[st.out.first_unit + u] = st.v->bwd0[u];
      }
    }
    for (int s = 0; s + 1 < p_; ++s) link(s);
    tie();
    std::vector<PipelineStage> out;
    for (Stage& st : stages_) out.push_back(std::move(st.out));
    return out;
  }

 private:
  bool checkpointed(int mb) const { return pipeline_checkpointed(c_.plan, mb); }

  void forward(Stage& st, int mb) {
    Ctx& v = *st.v;
    const int units = static_cast<int>(v.units.size());
    const bool ckpt = checkpointed(mb);
    for (int u = 0; u < units; ++u) {
      const Unit& x = v.units[static_cast<std::size_t>(u)];
      const TaskId fwd = v.compute_task(x.fwd_s, v.n_fwd, u, mb);
      v.g.add_dep(fwd, st.params->before_fwd(u, mb));
      v.fwd[static_cast<std::size_t>(u)] = fwd;
      if (mb == 0) v.fwd0[static_cast<std::size_t>(u)] = fwd;
      st.out.work.push_back(fwd);
      if (u == 0) st.fwd_first[static_cast<std::size_t>(mb)] = fwd;
      if (u + 1 == units) st.fwd_last[static_cast<std::size_t>(mb)] = fwd;
      if (!ckpt) {
        st.acts[static_cast<std::size_t>(mb)].on_fwd(u, mb, fwd);
      } else {
        // Nothing saved: the forward's profiled peak is transient; the stage's output is kept until it
        // has been sent (the last stage's loss reads it in its forward).
        const std::int64_t own_output = u + 1 == units ? x.output : 0;
        v.g.alloc(fwd, v.dev, std::max<std::int64_t>(0, x.peak_fwd - own_output), MemCategory::activations,
                  v.label(v.n_workspace, u, mb));
        if (u + 1 == units)
          st.kept_output[static_cast<std::size_t>(mb)] =
              v.g.alloc(fwd, v.dev, x.output, MemCategory::activations, v.label(v.n_saved, u, mb), fwd);
      }
      st.params->after_fwd(u, mb, fwd);
    }
  }

  void backward(Stage& st, int mb) {
    Ctx& v = *st.v;
    const int units = static_cast<int>(v.units.size());
    Activations& acts = st.acts[static_cast<std::size_t>(mb)];
    if (checkpointed(mb)) {
      // Recompute the stage's forward from its kept input: the activations of a normal forward (kept on
      // the device: the backward needs them next).
      acts.keep_on_device();
      for (int u = 0; u < units; ++u) {
        const TaskId re = v.compute_task(v.units[static_cast<std::size_t>(u)].recompute_s, v.n_recompute, u, mb);
        v.fwd[static_cast<std::size_t>(u)] = re;
        st.out.work.push_back(re);
        acts.on_fwd(u, mb, re);
      }
    }
    // A replica of a weight owned on an earlier stage: its gradient is copied and sent to the owner after
    // the unit's backward (every microbatch at zero stage 2, which reduces every microbatch; else the
    // accumulated one after the last), the copy held until the stage's backward of the microbatch is done.
    AllocId tied_copy = kNone;
    TaskId tied_task = kNone;
    int tied_unit = -1;
    if (!st.out.work.empty()) acts.backward_starts_after(st.out.work.back());
    for (int u = units - 1; u >= 0; --u) {
      const TaskId params_ready = st.params->before_bwd(u, mb);
      const TaskId acts_ready = acts.before_bwd(u, mb, params_ready);
      const TaskId bwd = v.compute_task(v.units[static_cast<std::size_t>(u)].bwd_s, v.n_bwd, u, mb);
      v.g.add_dep(bwd, params_ready);
      v.g.add_dep(bwd, acts_ready);
      v.bwd[static_cast<std::size_t>(u)] = bwd;
      if (mb == 0) v.bwd0[static_cast<std::size_t>(u)] = bwd;
      st.out.work.push_back(bwd);
      if (u + 1 == units) st.bwd_last[static_cast<std::size_t>(mb)] = bwd;
      if (u == 0) st.bwd_first[static_cast<std::size_t>(mb)] = bwd;
      const Unit& x = v.units[static_cast<std::size_t>(u)];
      TaskId copy = kNone;
      if (x.replica_params > 0 && (c_.plan.zero_stage >= 2 || mb + 1 == m_)) {
        // The copy is made once the backward is done, before the unit's gradient is reduced.
        copy = v.g.add_task(v.compute, 0.0, v.label(n_tied_, u, mb), {bwd}, c_.n_cat_compute);
        tied_copy = v.g.alloc(copy, v.dev, x.replica_params * v.b.grad, MemCategory::grads, v.label(n_tied_, u, mb), kNone);
        tied_task = copy;
        tied_unit = u;
        st.tied_copies.emplace_back(copy, u);
      }
      const TaskId done = st.grads->after_bwd(u, mb, bwd);
      if (copy != kNone && done != bwd) v.g.add_dep(done, copy);
      acts.after_bwd(u, mb, bwd);
      st.params->after_bwd(u, mb, done);
      v.bwd[static_cast<std::size_t>(u)] = done;
      if (done != bwd) st.out.work.push_back(done);  // the gradient's accumulation (stage 2)
    }
    // Held until the stage's backward of the microbatch is done (the first unit's reduction issued).
    if (tied_copy != kNone) {
      const bool no_reduction_task = tied_unit == 0 && v.bwd[0] == st.bwd_first[static_cast<std::size_t>(mb)];
      v.g.set_free_at(tied_copy, no_reduction_task ? tied_task : v.bwd[0]);
    }
    st.grads->finish_microbatch(mb);
  }

  int stage_of(int unit) const {
    for (int s = 0; s < p_; ++s) {
      const PipelineStage& o = stages_[static_cast<std::size_t>(s)].out;
      if (unit >= o.first_unit && unit < o.first_unit + o.units) return s;
    }
    return -1;
  }
  // Whether a later stage borrows a weight of stage s's units (a replica it keeps: tied embeddings).
  bool lends(int s) const {
    for (int r = s + 1; r < p_; ++r)
      for (const Unit& u : stages_[static_cast<std::size_t>(r)].v->units)
        for (const auto& [o, params] : u.borrows)
          if (stage_of(o) == s) return true;
    return false;
  }

  // Tied weights across stages, as the executor's pipeline piece moves them: each replica's gradient
  // copy is sent to the owner, who adds it before its optimizer step; after both optimizer steps the
  // owner sends the updated weight to the replica (its next step's forward reads it). One channel per
  // direction and pair of stages.
  void tie() {
    const NameId grad_send = c_.g.intern("send tied gradients"), param_send = c_.g.intern("send tied weights");
    for (int r = 0; r < p_; ++r) {
      Stage& rep = stages_[static_cast<std::size_t>(r)];
      for (int u = 0; u < static_cast<int>(rep.v->units.size()); ++u) {
        for (const auto& [o, params] : rep.v->units[static_cast<std::size_t>(u)].borrows) {
          const int s = stage_of(o);
          if (s < 0 || s >= r) continue;
          Stage& own = stages_[static_cast<std::size_t>(s)];
          const bool near = same_node(s, r, c_.n, c_.cluster.devices_per_node);
          const ResourceId back = c_.g.add_resource(fmt::format("p2p.s{}>s{}.tied", r, s), ResourceKind::comm);
          const ResourceId out = c_.g.add_resource(fmt::format("p2p.s{}>s{}.tied", s, r), ResourceKind::comm);
          const double grad_t = p2p_time(c_.cluster, static_cast<double>(params * rep.v->b.grad), near);
          for (const auto& [copy, cu] : rep.tied_copies) {
            if (cu != u) continue;
            const TaskId send = c_.g.add_task(back, grad_t, rep.v->label(grad_send, u), {copy}, c_.n_cat_comm);
            c_.g.add_dep(own.tied_in, send);
          }
          const double param_t = p2p_time(c_.cluster, static_cast<double>(params * rep.v->b.param), near);
          c_.g.add_task(out, param_t, own.v->label(param_send, o - own.out.first_unit), {own.opt_end, rep.opt_end},
                        c_.n_cat_comm);
        }
      }
    }
  }

  // The sends between stage s and s + 1, one resource per direction, in microbatch order.
  void link(int s) {
    Stage& a = stages_[static_cast<std::size_t>(s)];
    Stage& b = stages_[static_cast<std::size_t>(s + 1)];
    const bool near = same_node(s, s + 1, c_.n, c_.cluster.devices_per_node);
    const std::int64_t bytes = a.v->units.back().output;
    const double t = p2p_time(c_.cluster, static_cast<double>(bytes), near);
    const ResourceId fwd_link = c_.g.add_resource(fmt::format("p2p.s{}>s{}", s, s + 1), ResourceKind::comm);
    const ResourceId bwd_link = c_.g.add_resource(fmt::format("p2p.s{}>s{}", s + 1, s), ResourceKind::comm);
    const NameId act = c_.g.intern("send activations"), grad = c_.g.intern("send gradients");
    const NameId received = c_.g.intern("received activations"), received_grad = c_.g.intern("received gradients");
    const NameId sent_grad = c_.g.intern("sent gradients");
    const int last = static_cast<int>(a.v->units.size()) - 1;
    AllocId sent = kNone;  // the gradient in flight
    for (int j = 0; j < m_; ++j) {
      const auto mb = static_cast<std::size_t>(j);
      const TaskId send = c_.g.add_task(fwd_link, t, a.v->label(act, last, j), {a.fwd_last[mb]}, c_.n_cat_comm);
      if (a.kept_output[mb] != kNone) c_.g.set_free_at(a.kept_output[mb], send);
      c_.g.add_dep(b.fwd_first[mb], send);
      // Sends are rendezvous, as Gloo's are: the receiver's buffer is allocated when it asks for the data,
      // at the start of the forward or backward that needs it (the executor's recv), not when the sender
      // is done. The received input lives until the first unit's forward ends (it is in that unit's saved
      // bytes from then on); a checkpointed microbatch keeps it until the stage's backward is done.
      c_.g.alloc(b.fwd_first[mb], b.v->dev, bytes, MemCategory::activations, b.v->label(received, 0, j),
                 checkpointed(j) ? b.bwd_first[mb] : b.fwd_first[mb]);
      // The sender keeps the gradient it sent until it sends the next one (one in flight; the last to the
      // end of the step): the executor waits the previous send, then lets its buffer go, once this
      // microbatch's backward is done. A zero-time task on the link, after the previous send, marks it.
      if (sent != kNone) {
        c_.g.set_free_at(sent, c_.g.add_task(bwd_link, 0, b.v->label(sent_grad, 0, j - 1), {b.bwd_first[mb]},
                                              c_.n_cat_comm));
      }
      const TaskId back = c_.g.add_task(bwd_link, t, b.v->label(grad, 0, j), {b.bwd_first[mb]}, c_.n_cat_comm);
      c_.g.add_dep(a.bwd_last[mb], back);
      if (const TaskId h2d = a.acts[mb].last_unit_copy_back(); h2d != kNone) c_.g.add_dep(h2d, back);  // offloaded activations come back after it
      c_.g.alloc(a.bwd_last[mb], a.v->dev, bytes, MemCategory::activations, a.v->label(received_grad, last, j),
                 a.bwd_last[mb]);
      sent = c_.g.alloc(back, b.v->dev, bytes, MemCategory::activations, b.v->label(sent_grad, 0, j), kNone);
    }
  }

  Ctx& c_;
  const int p_, m_;
  const NameId n_tied_, n_tied_in_;
  std::vector<Stage> stages_;
};

}  // namespace

std::vector<PipelineStage> schedule_pipeline(Ctx& c) { return Pipeline(c).run(); }

}  // namespace zeroplan::sim::lowering
