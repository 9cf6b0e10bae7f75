// fairscale OffloadModel: the model lives on the host; `slices` groups of consecutive units, balanced by
// parameter count, are copied to the device one at a time. Every accumulation microbatch (plan
// microbatches) runs the whole schedule; inside it each slice runs all `offload_model.microbatches`
// chunks of the micro batch. Forward: H2D the slice, run the chunks, drop it. Backward, slices in
// reverse: H2D the slice (from the second accumulation microbatch on with its accumulated gradient:
// fairscale moves a slice with its .grad), run the chunks' backward (after recomputing the slice forward
// from the slice-boundary input when checkpoint_activation, which keeps only boundary activations, on
// the host), D2H the gradients (all-reduced first on the last microbatch only, as no_sync accumulation).
// The last slice's outputs stay on the device for the loss until their backward. The optimizer steps on
// the host.
#include <algorithm>

#include "context.h"
#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim::lowering {

namespace {

std::vector<int> slice_starts(const std::vector<Unit>& units, int slices, std::int64_t total) {
  const int n = static_cast<int>(units.size());
  std::vector<int> starts{0};
  std::int64_t cum = 0;
  for (int u = 0; u < n && static_cast<int>(starts.size()) < slices; ++u) {
    cum += units[static_cast<std::size_t>(u)].params;
    const int s = static_cast<int>(starts.size());
    const bool reached = cum * slices >= total * s;
    const bool must = n - (u + 1) == slices - s;  // exactly one unit left per remaining slice
    if ((reached || must) && u + 1 < n) starts.push_back(u + 1);
  }
  starts.push_back(n);
  return starts;
}

}  // namespace

void schedule_offload_model(Ctx& c) {
  const int k_chunks = c.plan.offload_model.microbatches;
  const bool ckpt = c.plan.offload_model.checkpoint_activation;
  const int n_units = static_cast<int>(c.units.size());
  const std::vector<int> starts = slice_starts(c.units, c.plan.offload_model.slices, std::max<std::int64_t>(1, c.total_params));
  const int slices = static_cast<int>(starts.size()) - 1;
  auto slice_params = [&](int s) {
    std::int64_t p = 0;
    for (int u = starts[static_cast<std::size_t>(s)]; u < starts[static_cast<std::size_t>(s) + 1]; ++u) {
      p += c.units[static_cast<std::size_t>(u)].params;
    }
    return p;
  };
  auto h2d = [&](double bytes, int s, int mb, TaskId after) {
    return c.g.add_task(c.h2d, copy_time(c.cluster, CopyDir::h2d, bytes), c.label(c.n_h2d, s, mb), {after}, c.n_cat_copy);
  };
  auto d2h = [&](double bytes, int s, int mb, TaskId after) {
    return c.g.add_task(c.d2h, copy_time(c.cluster, CopyDir::d2h, bytes), c.label(c.n_d2h, s, mb), {after}, c.n_cat_copy);
  };
  auto unit = [&](int u) -> const Unit& { return c.units[static_cast<std::size_t>(u)]; };

  std::vector<TaskId> grads_home(static_cast<std::size_t>(slices), kNone);  // per slice: its last gradient D2H
  TaskId prev = kNone;  // the compute task the next slice's load waits for
  for (int mb = 0; mb < c.m; ++mb) {
    const bool last_mb = mb + 1 == c.m;
    auto chunk = [&](int k) { return mb * k_chunks + k; };  // chunk index over the step, for labels
    std::vector<AllocId> saved(static_cast<std::size_t>(n_units * k_chunks), kNone);
    std::vector<AllocId> boundary(static_cast<std::size_t>(slices * k_chunks), kNone);  // host copies of slice inputs
    std::vector<AllocId> loss(static_cast<std::size_t>(k_chunks), kNone);  // the last unit's output per chunk
    auto at = [&](int u, int k) -> AllocId& { return saved[static_cast<std::size_t>(u * k_chunks + k)]; };

    // Forward.
    for (int s = 0; s < slices; ++s) {
      const int first = starts[static_cast<std::size_t>(s)], end = starts[static_cast<std::size_t>(s) + 1];
      const std::int64_t pbytes = slice_params(s) * c.b.param;
      const TaskId in = h2d(static_cast<double>(pbytes), s, mb, prev);
      const AllocId dev_params = c.g.alloc(in, c.dev, pbytes, MemCategory::params, c.label(c.n_params, s), kNone);
      TaskId last = kNone;
      for (int k = 0; k < k_chunks; ++k) {
        for (int u = first; u < end; ++u) {
          last = c.compute_task(unit(u).fwd_s, c.n_fwd, u, chunk(k));
          if (mb == 0 && k == 0) c.fwd0[static_cast<std::size_t>(u)] = last;
          c.g.add_dep(last, in);
          c.g.alloc(last, c.dev, forward_workspace(c.units, static_cast<std::size_t>(u)), MemCategory::activations,
                    c.label(c.n_workspace, u, chunk(k)));
          if (!ckpt) at(u, k) = c.g.alloc(last, c.dev, unit(u).saved, MemCategory::activations, c.label(c.n_saved, u, chunk(k)), kNone);
          if (u + 1 == n_units)
            loss[static_cast<std::size_t>(k)] =
                c.g.alloc(last, c.dev, unit(u).output, MemCategory::activations, c.label(c.n_saved, u, chunk(k)), kNone);
        }
        if (ckpt && s + 1 < slices) {  // the next slice's input goes to the host
          const std::int64_t out = unit(end - 1).output;
          const TaskId copy = d2h(static_cast<double>(out), s, mb, last);
          c.g.alloc(last, c.dev, out, MemCategory::activations, c.label(c.n_saved, end - 1, chunk(k)), copy);
          boundary[static_cast<std::size_t>((s + 1) * k_chunks + k)] =
              c.g.alloc(copy, c.host, out, MemCategory::activations, c.label(c.n_saved_offloaded, end - 1, chunk(k)), kNone);
        }
      }
      c.g.set_free_at(dev_params, last);
      prev = last;
    }
    // Backward.
    for (int s = slices - 1; s >= 0; --s) {
      const int first = starts[static_cast<std::size_t>(s)], end = starts[static_cast<std::size_t>(s) + 1];
      const std::int64_t p = slice_params(s);
      const std::int64_t carried = mb > 0 ? p * c.b.grad : 0;  // the accumulated gradient travels with the slice
      const TaskId in = h2d(static_cast<double>(p * c.b.param + carried), s, mb, prev);
      c.g.add_dep(in, grads_home[static_cast<std::size_t>(s)]);  // the previous microbatch's gradient is home
      const AllocId dev_params = c.g.alloc(in, c.dev, p * c.b.param, MemCategory::params, c.label(c.n_params, s), kNone);
      AllocId dev_grads = carried > 0 ? c.g.alloc(in, c.dev, carried, MemCategory::grads, c.label(c.n_grads, s), kNone) : kNone;
      TaskId last = kNone;
      for (int k = 0; k < k_chunks; ++k) {
        TaskId ready = in;
        AllocId restored = kNone;  // device copy of the slice input, freed by the chunk's last backward
        if (ckpt) {
          if (const AllocId b = boundary[static_cast<std::size_t>(s * k_chunks + k)]; b != kNone) {
            const std::int64_t bytes = c.g.allocs()[b].bytes;
            const TaskId back = h2d(static_cast<double>(bytes), s, mb, in);
            c.g.set_free_at(b, back);
            restored = c.g.alloc(back, c.dev, bytes, MemCategory::activations, c.label(c.n_input_kept, first, chunk(k)), kNone);
            ready = back;
          }
          for (int u = first; u < end; ++u) {
            const TaskId re = c.compute_task(unit(u).fwd_s, c.n_recompute, u, chunk(k));
            c.g.add_dep(re, ready);
            c.g.alloc(re, c.dev, forward_workspace(c.units, static_cast<std::size_t>(u)), MemCategory::activations,
                      c.label(c.n_workspace, u, chunk(k)));
            at(u, k) = c.g.alloc(re, c.dev, unit(u).saved, MemCategory::activations, c.label(c.n_saved, u, chunk(k)), kNone);
          }
        }
        for (int u = end - 1; u >= first; --u) {
          last = c.compute_task(unit(u).bwd_s, c.n_bwd, u, chunk(k));
          if (mb == 0 && k == 0) c.bwd0[static_cast<std::size_t>(u)] = last;
          c.g.add_dep(last, ready);
          if (dev_grads == kNone) {
            dev_grads = c.g.alloc(last, c.dev, p * c.b.grad, MemCategory::grads, c.label(c.n_grads, s), kNone);
          }
          c.g.alloc(last, c.dev, unit(u).peak_bwd, MemCategory::activations, c.label(c.n_workspace, u, chunk(k)));
          c.g.set_free_at(at(u, k), last);
          if (u + 1 == n_units) c.g.set_free_at(loss[static_cast<std::size_t>(k)], last);
        }
        if (restored != kNone) c.g.set_free_at(restored, last);
      }
      TaskId reduced = last;
      if (c.n > 1 && last_mb) {
        reduced = c.g.add_task(c.comm, collective_time(c.cluster, CollOp::all_reduce, static_cast<double>(p * c.b.reduce), c.n),
                               c.label(c.n_all_reduce, s), {last}, c.n_cat_comm);
      }
      const TaskId out = d2h(static_cast<double>(p * c.b.grad), s, mb, reduced);
      c.g.set_free_at(dev_params, out);
      if (dev_grads != kNone) c.g.set_free_at(dev_grads, out);
      grads_home[static_cast<std::size_t>(s)] = out;
      prev = last;
    }
  }
  const TaskId step = c.g.add_task(
      c.host_opt, host_optimizer_time(c.cluster, c.plan.optimizer.name, static_cast<double>(c.total_params), c.plan.flat_params),
      c.label(c.n_optimizer), {}, c.n_cat_optimizer);
  for (TaskId t : grads_home) c.g.add_dep(step, t);
}

}  // namespace zeroplan::sim::lowering
