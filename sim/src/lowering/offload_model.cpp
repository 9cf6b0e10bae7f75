// fairscale OffloadModel, as the executor runs it (exec/src/step/offload_model.cpp,
// OffloadModel::microbatch): the model states live on the host (model_states.cpp); slices of
// consecutive units, balanced by parameter count (offload_model_slice_starts, the executor's function),
// visit the device. Every accumulation microbatch (plan microbatches) runs the whole schedule, the micro
// batch in `offload_model.microbatches` chunks:
//  forward   slice by slice: H2D its parameters (and those of earlier units its units borrow, tied
//            weights), run every chunk through it, drop it. Kept activations per chunk as the
//            Activations piece keeps them; a chunk's output waits between slices. With
//            checkpoint_activation each chunk's slice input comes from the host, the slice runs without a
//            graph and its output goes to the host (the model's input too), the RNG state is kept;
//  loss      per chunk after the last slice (the logits' gradient waits for the backward);
//  backward  slices in reverse: H2D the parameters and the gradients (zeros in the first microbatch, the
//            host's accumulated ones after: fairscale moves .grad with the shard; a lender's gradient
//            from its first borrower on), every chunk (checkpoint_activation: its input back from the
//            host and the slice recomputed with its graph first), then per unit: all-reduce (last
//            microbatch, as no_sync accumulation), D2H; a chunk's input gradient waits between slices.
// The executor is sequential (every copy waited for), so every task here follows the previous one. The
// optimizer steps on the host.
#include <algorithm>

#include "context.h"
#include "zeroplan/profiles/pipeline.h"
#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim::lowering {

namespace {

// What one accumulation microbatch holds between its slices, per chunk.
struct Microbatch {
  std::vector<Activations> acts;  // kept activations, without checkpoint_activation
  std::vector<AllocId> boundary;  // [slice x chunk] on the host: a slice's input (checkpoint_activation)
  std::vector<AllocId> rng;       // [slice x chunk] the RNG state kept for the recompute
  std::vector<AllocId> loss;      // checkpoint_activation: the logits' gradient
  std::vector<AllocId> wait;      // a chunk's tensor between slices
  Microbatch(Ctx& c, int slices, int chunks)
      : acts(static_cast<std::size_t>(chunks), Activations(c)),
        boundary(static_cast<std::size_t>(slices * chunks), kNone),
        rng(static_cast<std::size_t>(slices * chunks), kNone),
        loss(static_cast<std::size_t>(chunks), kNone),
        wait(static_cast<std::size_t>(chunks), kNone) {}
};

class Schedule {
 public:
  explicit Schedule(Ctx& ctx) : c(ctx) {
    K = c.plan.offload_model.microbatches;
    ckpt = c.plan.offload_model.checkpoint_activation;
    reduce_.dtype = c.plan.precision.reduce_dtype;
    n_units = static_cast<int>(c.units.size());
    std::vector<std::int64_t> params;
    for (const Unit& u : c.units) params.push_back(u.params);
    starts = offload_model_slice_starts(params, c.plan.offload_model.slices);
    std::vector<std::vector<int>> owners;
    for (const Unit& u : c.units) {
      owners.emplace_back();
      for (const auto& [o, n] : u.borrows) owners.back().push_back(o);
    }
    slice_members = offload_model_slice_members(starts, owners);
    in0 = c.input0;  // one chunk of the model's input
    grad_.assign(static_cast<std::size_t>(n_units), kNone);
  }

  void run() {
    if (const TaskId z = zero_grads(c); z != kNone) chain(z);  // the host gradients zeroed first
    for (int mb = 0; mb < c.m; ++mb) {
      Microbatch m(c, slices(), K);
      chunk_inputs(mb, m);
      for (int s = 0; s < slices(); ++s) forward(mb, s, m);
      grads_home_.clear();
      for (int s = slices() - 1; s >= 0; --s) backward(mb, s, m);
    }
    // Once every gradient is home (and, with a 16-bit model, through the host's fp32 master).
    grads_home_.push_back(prev);
    host_step(c, c.total_params, grads_home_, true);
  }

 private:
  Ctx& c;
  int K = 1;
  bool ckpt = false;
  int n_units = 0;
  std::int64_t in0 = 0;
  std::vector<int> starts;
  std::vector<std::vector<int>> slice_members;  // offload_model_slice_members
  CollectiveOptions reduce_;
  std::vector<AllocId> grad_;        // per unit: its device gradient
  std::vector<TaskId> grads_home_;  // the last microbatch's gradient copies to the host
  TaskId prev = kNone;              // the last task in the executor's order

  int slices() const { return static_cast<int>(starts.size()) - 1; }
  int first(int s) const { return starts[static_cast<std::size_t>(s)]; }
  int end(int s) const { return starts[static_cast<std::size_t>(s) + 1]; }
  const Unit& unit(int u) const { return c.units[static_cast<std::size_t>(u)]; }
  std::int64_t input_of(int u) const { return u > 0 ? unit(u - 1).output : 0; }
  int chunk(int mb, int k) const { return mb * K + k; }
  std::size_t at(int s, int k) const { return static_cast<std::size_t>(s * K + k); }

  const std::vector<int>& members(int s) const { return slice_members[static_cast<std::size_t>(s)]; }
  TaskId chain(TaskId t) {
    c.g.add_dep(t, prev);
    prev = t;
    return t;
  }
  TaskId compute(double s, NameId name, int u, int chunk) { return chain(c.compute_task(s, name, u, chunk)); }
  // A zero-time point on the compute stream, in order: what is held between two tasks is allocated at
  // one after the first and freed at one before the second, so neither task's own figures count it twice.
  TaskId mark(int u, int chunk) { return chain(c.g.add_task(c.compute, 0.0, c.label(c.n_saved, u, chunk), {}, c.n_cat_compute)); }
  TaskId copy(CopyDir dir, std::int64_t bytes, int u, int chunk) {
    const ResourceId r = dir == CopyDir::h2d ? c.h2d : c.d2h;
    return chain(c.g.add_task(r, copy_time(c.cluster, dir, static_cast<double>(bytes)),
                              c.label(dir == CopyDir::h2d ? c.n_h2d : c.n_d2h, u, chunk), {}, c.n_cat_copy));
  }

  void chunk_inputs(int mb, Microbatch& m) {
    // The chunks' inputs: on the device until unit 0's forward (its saved bytes), or sent to the host.
    const TaskId start = mark(0, chunk(mb, 0));
    for (int k = 0; k < K; ++k) {
      if (!ckpt) {
        m.wait[static_cast<std::size_t>(k)] = c.g.alloc(start, c.dev, in0, MemCategory::activations, c.label(c.n_saved, 0, chunk(mb, k)), kNone);
        continue;
      }
      const TaskId d2h = copy(CopyDir::d2h, in0, 0, chunk(mb, k));
      c.g.alloc(d2h, c.dev, in0, MemCategory::activations, c.label(c.n_saved, 0, chunk(mb, k)));
      m.boundary[at(0, k)] = c.g.alloc(d2h, c.host, in0, MemCategory::activations, c.label(c.n_saved_offloaded, 0, chunk(mb, k)), kNone);
    }
  }

  // Forward of slice s: H2D its parameters, every chunk through it, drop it.
  void forward(int mb, int s, Microbatch& m) {
    std::int64_t bytes = 0;
    for (int u : members(s)) bytes += unit(u).params * c.b.param;
    const TaskId load = copy(CopyDir::h2d, bytes, first(s), chunk(mb, 0));
    const AllocId dev_params = c.g.alloc(load, c.dev, bytes, MemCategory::params, c.label(c.n_params, first(s)), kNone);
    for (int k = 0; k < K; ++k) {
      const auto kk = static_cast<std::size_t>(k);
      AllocId in_dev = kNone;
      if (ckpt) {
        const std::int64_t b = s == 0 ? in0 : input_of(first(s));
        const TaskId h2d = copy(CopyDir::h2d, b, first(s), chunk(mb, k));
        in_dev = c.g.alloc(h2d, c.dev, b, MemCategory::activations, c.label(c.n_input_kept, first(s), chunk(mb, k)), kNone);
      } else if (m.wait[kk] != kNone) {
        c.g.set_free_at(m.wait[kk], mark(first(s), chunk(mb, k)));
        m.wait[kk] = kNone;
      }
      TaskId fwd = kNone;
      for (int u = first(s); u < end(s); ++u) {
        const Unit& x = unit(u);
        fwd = compute(x.fwd_s, c.n_fwd, u, chunk(mb, k));
        if (mb == 0 && k == 0) c.fwd0[static_cast<std::size_t>(u)] = fwd;
        if (!ckpt) {
          m.acts[kk].on_fwd(u, chunk(mb, k), fwd);
          continue;
        }
        // Without a graph: the input until the forward ends, what the forward allocates beyond it.
        const std::int64_t own_output = u + 1 == n_units ? x.output : 0;
        const std::int64_t input = u == first(s) ? 0 : input_of(u);
        c.g.alloc(fwd, c.dev, input + std::max<std::int64_t>(0, x.peak_fwd - own_output), MemCategory::activations,
                  c.label(c.n_workspace, u, chunk(mb, k)));
        if (u == first(s)) {
          c.g.set_free_at(in_dev, fwd);
          if (c.rng_state_bytes > 0)
            m.rng[at(s, k)] = c.g.alloc(fwd, c.dev, c.rng_state_bytes, MemCategory::activations, c.label(c.n_input_kept, u, chunk(mb, k)), kNone);
        }
        if (u + 1 == n_units)
          m.loss[kk] = c.g.alloc(fwd, c.dev, x.output, MemCategory::activations, c.label(c.n_saved, u, chunk(mb, k)), kNone);
      }
      if (s + 1 == slices()) continue;
      const std::int64_t out = unit(end(s) - 1).output;
      if (ckpt) {  // the slice's output to the host
        const TaskId d2h = copy(CopyDir::d2h, out, end(s) - 1, chunk(mb, k));
        c.g.alloc(d2h, c.dev, out, MemCategory::activations, c.label(c.n_saved, end(s) - 1, chunk(mb, k)));
        m.boundary[at(s + 1, k)] =
            c.g.alloc(d2h, c.host, out, MemCategory::activations, c.label(c.n_saved_offloaded, end(s) - 1, chunk(mb, k)), kNone);
      } else {  // waits on the device for the next slice
        m.wait[kk] = c.g.alloc(mark(end(s) - 1, chunk(mb, k)), c.dev, out, MemCategory::activations,
                             c.label(c.n_saved, end(s) - 1, chunk(mb, k)), kNone);
      }
    }
    c.g.set_free_at(dev_params, prev);
  }

  // Backward of slice s: H2D its parameters and gradients, every chunk (recomputed first with
  // checkpoint_activation), then per unit the all-reduce (last microbatch) and the D2H of its gradient.
  void backward(int mb, int s, Microbatch& m) {
    const std::vector<int>& mem = members(s);
    std::int64_t pbytes = 0, gbytes = 0;
    for (int u : mem) {
      pbytes += unit(u).params * c.b.param;
      if (grad_[static_cast<std::size_t>(u)] == kNone && mb > 0) gbytes += unit(u).params * c.b.grad;
    }
    const TaskId load = copy(CopyDir::h2d, pbytes + gbytes, first(s), chunk(mb, 0));
    const AllocId dev_params = c.g.alloc(load, c.dev, pbytes, MemCategory::params, c.label(c.n_params, first(s)), kNone);
    for (int u : mem) {
      if (grad_[static_cast<std::size_t>(u)] != kNone || unit(u).params == 0) continue;
      grad_[static_cast<std::size_t>(u)] =
          c.g.alloc(load, c.dev, unit(u).params * c.b.grad, MemCategory::grads, c.label(c.n_grads, u), kNone);
    }
    for (int k = 0; k < K; ++k) {
      const auto kk = static_cast<std::size_t>(k);
      std::vector<AllocId> held(static_cast<std::size_t>(n_units), kNone);  // ckpt: the recompute's saved
      AllocId restored = kNone;
      if (ckpt) {
        const std::int64_t b = s == 0 ? in0 : input_of(first(s));
        const TaskId h2d = copy(CopyDir::h2d, b, first(s), chunk(mb, k));
        c.g.set_free_at(m.boundary[at(s, k)], h2d);
        if (m.rng[at(s, k)] != kNone) c.g.set_free_at(m.rng[at(s, k)], h2d);
        restored = c.g.alloc(h2d, c.dev, b, MemCategory::activations, c.label(c.n_input_kept, first(s), chunk(mb, k)), kNone);
        for (int u = first(s); u < end(s); ++u) {
          const Unit& x = unit(u);
          const TaskId re = compute(x.recompute_s, c.n_recompute, u, chunk(mb, k));
          c.g.alloc(re, c.dev, recompute_workspace(c.units, static_cast<std::size_t>(u)), MemCategory::activations,
                    c.label(c.n_workspace, u, chunk(mb, k)));
          // The restored input is held already (the saved bytes count every unit's input).
          const std::int64_t keep = u == first(s) ? std::max<std::int64_t>(0, x.saved - b) : x.saved;
          held[static_cast<std::size_t>(u)] = c.g.alloc(re, c.dev, keep, MemCategory::activations, c.label(c.n_saved, u, chunk(mb, k)), kNone);
        }
      }
      if (m.wait[kk] != kNone) {  // the gradient from the next slice is taken up
        c.g.set_free_at(m.wait[kk], mark(end(s) - 1, chunk(mb, k)));
        m.wait[kk] = kNone;
      }
      TaskId bwd = kNone;
      for (int u = end(s) - 1; u >= first(s); --u) {
        const Unit& x = unit(u);
        bwd = compute(x.bwd_s, c.n_bwd, u, chunk(mb, k));
        if (mb == 0 && k == 0) c.bwd0[static_cast<std::size_t>(u)] = bwd;
        if (!ckpt) {
          m.acts[kk].after_bwd(u, chunk(mb, k), bwd);
          continue;
        }
        const std::int64_t incoming = u + 1 < n_units ? x.output : 0;
        c.g.alloc(bwd, c.dev, x.peak_bwd + 2 * incoming, MemCategory::activations, c.label(c.n_workspace, u, chunk(mb, k)));
        c.g.set_free_at(held[static_cast<std::size_t>(u)], bwd);
        if (u + 1 == n_units) c.g.set_free_at(m.loss[kk], bwd);
      }
      if (restored != kNone) c.g.set_free_at(restored, bwd);
      if (s > 0) {  // the slice input's gradient (and, kept, that input) waits for the previous slice
        const std::int64_t out = input_of(first(s));
        m.wait[kk] = c.g.alloc(mark(first(s), chunk(mb, k)), c.dev, (ckpt ? 1 : 2) * out, MemCategory::activations,
                             c.label(c.n_saved, first(s) - 1, chunk(mb, k)), kNone);
      }
    }
    for (int u = first(s); u < end(s); ++u) {
      const std::int64_t p = unit(u).params;
      if (p == 0) continue;
      if (c.n > 1 && mb + 1 == c.m) {
        chain(c.g.add_task(c.comm, collective_time(c.cluster, CollOp::all_reduce, static_cast<double>(p * c.b.reduce), c.n, reduce_),
                              c.label(c.n_all_reduce, u), {}, c.n_cat_comm));
      }
      const TaskId d2h = copy(CopyDir::d2h, p * c.b.grad, u, chunk(mb, 0));
      c.g.set_free_at(grad_[static_cast<std::size_t>(u)], d2h);
      grad_[static_cast<std::size_t>(u)] = kNone;
      grads_home_.push_back(d2h);
    }
    c.g.set_free_at(dev_params, prev);
  }
};

}  // namespace

void schedule_offload_model(Ctx& c) { Schedule(c).run(); }

}  // namespace zeroplan::sim::lowering
