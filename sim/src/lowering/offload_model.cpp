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

struct Schedule {
  Ctx& c;
  int K = 1;
  bool ckpt = false;
  int n_units = 0;
  std::vector<int> starts;
  std::vector<std::vector<int>> slice_members;  // offload_model_slice_members
  TaskId prev = kNone;  // the last task in the executor's order

  int slices() const { return static_cast<int>(starts.size()) - 1; }
  int first(int s) const { return starts[static_cast<std::size_t>(s)]; }
  int end(int s) const { return starts[static_cast<std::size_t>(s) + 1]; }
  const Unit& unit(int u) const { return c.units[static_cast<std::size_t>(u)]; }
  std::int64_t input_of(int u) const { return u > 0 ? unit(u - 1).output : 0; }

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
};

}  // namespace

void schedule_offload_model(Ctx& c) {
  Schedule sc{c, 1, false, 0, {}, {}, kNone};
  sc.K = c.plan.offload_model.microbatches;
  sc.ckpt = c.plan.offload_model.checkpoint_activation;
  CollectiveOptions reduce;
  reduce.dtype = c.plan.precision.reduce_dtype;
  sc.n_units = static_cast<int>(c.units.size());
  std::vector<std::int64_t> params;
  for (const Unit& u : c.units) params.push_back(u.params);
  sc.starts = offload_model_slice_starts(params, c.plan.offload_model.slices);
  std::vector<std::vector<int>> owners;
  for (const Unit& u : c.units) {
    owners.emplace_back();
    for (const auto& [o, n] : u.borrows) owners.back().push_back(o);
  }
  sc.slice_members = offload_model_slice_members(sc.starts, owners);
  const int K = sc.K, S = sc.slices(), n_units = sc.n_units;
  const bool ckpt = sc.ckpt;
  const std::int64_t in0 = c.input0;  // one chunk of the model's input
  auto at = [K](int s, int k) { return static_cast<std::size_t>(s * K + k); };

  if (const TaskId z = zero_grads(c); z != kNone) sc.chain(z);  // the host gradients zeroed first
  std::vector<AllocId> grad(static_cast<std::size_t>(n_units), kNone);  // per unit: its device gradient
  std::vector<TaskId> grads_home;
  for (int mb = 0; mb < c.m; ++mb) {
    const bool last_mb = mb + 1 == c.m;
    auto chunk = [&](int k) { return mb * K + k; };
    std::vector<Activations> acts(static_cast<std::size_t>(K), Activations(c));  // per chunk, without ckpt
    std::vector<AllocId> boundary(static_cast<std::size_t>(S * K), kNone);      // host: a slice's input
    std::vector<AllocId> rng(static_cast<std::size_t>(S * K), kNone);
    std::vector<AllocId> loss(static_cast<std::size_t>(K), kNone);              // ckpt: the logits' gradient
    std::vector<AllocId> wait(static_cast<std::size_t>(K), kNone);              // a chunk's tensor between slices

    // The chunks' inputs: on the device until unit 0's forward (its saved bytes), or sent to the host.
    const TaskId start = sc.mark(0, chunk(0));
    for (int k = 0; k < K; ++k) {
      if (!ckpt) {
        wait[static_cast<std::size_t>(k)] = c.g.alloc(start, c.dev, in0, MemCategory::activations, c.label(c.n_saved, 0, chunk(k)), kNone);
        continue;
      }
      const TaskId d2h = sc.copy(CopyDir::d2h, in0, 0, chunk(k));
      c.g.alloc(d2h, c.dev, in0, MemCategory::activations, c.label(c.n_saved, 0, chunk(k)));
      boundary[at(0, k)] = c.g.alloc(d2h, c.host, in0, MemCategory::activations, c.label(c.n_saved_offloaded, 0, chunk(k)), kNone);
    }

    // Forward.
    for (int s = 0; s < S; ++s) {
      std::int64_t bytes = 0;
      for (int u : sc.members(s)) bytes += sc.unit(u).params * c.b.param;
      const TaskId load = sc.copy(CopyDir::h2d, bytes, sc.first(s), chunk(0));
      const AllocId dev_params = c.g.alloc(load, c.dev, bytes, MemCategory::params, c.label(c.n_params, sc.first(s)), kNone);
      for (int k = 0; k < K; ++k) {
        const auto kk = static_cast<std::size_t>(k);
        AllocId in_dev = kNone;
        if (ckpt) {
          const std::int64_t b = s == 0 ? in0 : sc.input_of(sc.first(s));
          const TaskId h2d = sc.copy(CopyDir::h2d, b, sc.first(s), chunk(k));
          in_dev = c.g.alloc(h2d, c.dev, b, MemCategory::activations, c.label(c.n_input_kept, sc.first(s), chunk(k)), kNone);
        } else if (wait[kk] != kNone) {
          c.g.set_free_at(wait[kk], sc.mark(sc.first(s), chunk(k)));
          wait[kk] = kNone;
        }
        TaskId fwd = kNone;
        for (int u = sc.first(s); u < sc.end(s); ++u) {
          const Unit& x = sc.unit(u);
          fwd = sc.compute(x.fwd_s, c.n_fwd, u, chunk(k));
          if (mb == 0 && k == 0) c.fwd0[static_cast<std::size_t>(u)] = fwd;
          if (!ckpt) {
            acts[kk].on_fwd(u, chunk(k), fwd);
            continue;
          }
          // Without a graph: the input until the forward ends, what the forward allocates beyond it.
          const std::int64_t own_output = u + 1 == n_units ? x.output : 0;
          const std::int64_t input = u == sc.first(s) ? 0 : sc.input_of(u);
          c.g.alloc(fwd, c.dev, input + std::max<std::int64_t>(0, x.peak_fwd - own_output), MemCategory::activations,
                    c.label(c.n_workspace, u, chunk(k)));
          if (u == sc.first(s)) {
            c.g.set_free_at(in_dev, fwd);
            if (c.rng_state_bytes > 0)
              rng[at(s, k)] = c.g.alloc(fwd, c.dev, c.rng_state_bytes, MemCategory::activations, c.label(c.n_input_kept, u, chunk(k)), kNone);
          }
          if (u + 1 == n_units)
            loss[kk] = c.g.alloc(fwd, c.dev, x.output, MemCategory::activations, c.label(c.n_saved, u, chunk(k)), kNone);
        }
        if (s + 1 == S) continue;
        const std::int64_t out = sc.unit(sc.end(s) - 1).output;
        if (ckpt) {  // the slice's output to the host
          const TaskId d2h = sc.copy(CopyDir::d2h, out, sc.end(s) - 1, chunk(k));
          c.g.alloc(d2h, c.dev, out, MemCategory::activations, c.label(c.n_saved, sc.end(s) - 1, chunk(k)));
          boundary[at(s + 1, k)] =
              c.g.alloc(d2h, c.host, out, MemCategory::activations, c.label(c.n_saved_offloaded, sc.end(s) - 1, chunk(k)), kNone);
        } else {  // waits on the device for the next slice
          wait[kk] = c.g.alloc(sc.mark(sc.end(s) - 1, chunk(k)), c.dev, out, MemCategory::activations,
                               c.label(c.n_saved, sc.end(s) - 1, chunk(k)), kNone);
        }
      }
      c.g.set_free_at(dev_params, sc.prev);
    }

    // Backward.
    grads_home.clear();
    for (int s = S - 1; s >= 0; --s) {
      const std::vector<int>& mem = sc.members(s);
      std::int64_t pbytes = 0, gbytes = 0;
      for (int u : mem) {
        pbytes += sc.unit(u).params * c.b.param;
        if (grad[static_cast<std::size_t>(u)] == kNone && mb > 0) gbytes += sc.unit(u).params * c.b.grad;
      }
      const TaskId load = sc.copy(CopyDir::h2d, pbytes + gbytes, sc.first(s), chunk(0));
      const AllocId dev_params = c.g.alloc(load, c.dev, pbytes, MemCategory::params, c.label(c.n_params, sc.first(s)), kNone);
      for (int u : mem) {
        if (grad[static_cast<std::size_t>(u)] != kNone || sc.unit(u).params == 0) continue;
        grad[static_cast<std::size_t>(u)] =
            c.g.alloc(load, c.dev, sc.unit(u).params * c.b.grad, MemCategory::grads, c.label(c.n_grads, u), kNone);
      }
      for (int k = 0; k < K; ++k) {
        const auto kk = static_cast<std::size_t>(k);
        std::vector<AllocId> held(static_cast<std::size_t>(n_units), kNone);  // ckpt: the recompute's saved
        AllocId restored = kNone;
        if (ckpt) {
          const std::int64_t b = s == 0 ? in0 : sc.input_of(sc.first(s));
          const TaskId h2d = sc.copy(CopyDir::h2d, b, sc.first(s), chunk(k));
          c.g.set_free_at(boundary[at(s, k)], h2d);
          if (rng[at(s, k)] != kNone) c.g.set_free_at(rng[at(s, k)], h2d);
          restored = c.g.alloc(h2d, c.dev, b, MemCategory::activations, c.label(c.n_input_kept, sc.first(s), chunk(k)), kNone);
          for (int u = sc.first(s); u < sc.end(s); ++u) {
            const Unit& x = sc.unit(u);
            const TaskId re = sc.compute(x.recompute_s, c.n_recompute, u, chunk(k));
            c.g.alloc(re, c.dev, recompute_workspace(c.units, static_cast<std::size_t>(u)), MemCategory::activations,
                      c.label(c.n_workspace, u, chunk(k)));
            // The restored input is held already (the saved bytes count every unit's input).
            const std::int64_t keep = u == sc.first(s) ? std::max<std::int64_t>(0, x.saved - b) : x.saved;
            held[static_cast<std::size_t>(u)] = c.g.alloc(re, c.dev, keep, MemCategory::activations, c.label(c.n_saved, u, chunk(k)), kNone);
          }
        }
        if (wait[kk] != kNone) {  // the gradient from the next slice is taken up
          c.g.set_free_at(wait[kk], sc.mark(sc.end(s) - 1, chunk(k)));
          wait[kk] = kNone;
        }
        TaskId bwd = kNone;
        for (int u = sc.end(s) - 1; u >= sc.first(s); --u) {
          const Unit& x = sc.unit(u);
          bwd = sc.compute(x.bwd_s, c.n_bwd, u, chunk(k));
          if (mb == 0 && k == 0) c.bwd0[static_cast<std::size_t>(u)] = bwd;
          if (!ckpt) {
            acts[kk].after_bwd(u, chunk(k), bwd);
            continue;
          }
          const std::int64_t incoming = u + 1 < n_units ? x.output : 0;
          c.g.alloc(bwd, c.dev, x.peak_bwd + 2 * incoming, MemCategory::activations, c.label(c.n_workspace, u, chunk(k)));
          c.g.set_free_at(held[static_cast<std::size_t>(u)], bwd);
          if (u + 1 == n_units) c.g.set_free_at(loss[kk], bwd);
        }
        if (restored != kNone) c.g.set_free_at(restored, bwd);
        if (s > 0) {  // the slice input's gradient (and, kept, that input) waits for the previous slice
          const std::int64_t out = sc.input_of(sc.first(s));
          wait[kk] = c.g.alloc(sc.mark(sc.first(s), chunk(k)), c.dev, (ckpt ? 1 : 2) * out, MemCategory::activations,
                               c.label(c.n_saved, sc.first(s) - 1, chunk(k)), kNone);
        }
      }
      for (int u = sc.first(s); u < sc.end(s); ++u) {
        const std::int64_t p = sc.unit(u).params;
        if (p == 0) continue;
        if (c.n > 1 && last_mb) {
          sc.chain(c.g.add_task(c.comm, collective_time(c.cluster, CollOp::all_reduce, static_cast<double>(p * c.b.reduce), c.n, reduce),
                                c.label(c.n_all_reduce, u), {}, c.n_cat_comm));
        }
        const TaskId d2h = sc.copy(CopyDir::d2h, p * c.b.grad, u, chunk(0));
        c.g.set_free_at(grad[static_cast<std::size_t>(u)], d2h);
        grad[static_cast<std::size_t>(u)] = kNone;
        grads_home.push_back(d2h);
      }
      c.g.set_free_at(dev_params, sc.prev);
    }
  }
  // Once every gradient is home (and, with a 16-bit model, through the host's fp32 master).
  grads_home.push_back(sc.prev);
  host_step(c, c.total_params, grads_home, true);
}

}  // namespace zeroplan::sim::lowering
