// Activation policy per unit: keep the saved activations until the unit's backward; or offload a ratio
// of them (hfai CPUOffload, as the executor's ActivationOffload runs it, one saved tensor at a time:
// activation_offload.h picks which of the profile's saved tensors go; each is copied out on the copy lane
// as the forward saves it and held on the device only within the forward window; the compute lane waits
// for the unit's copies when its forward ends; before unit u's backward its tensors come back (H2D), at
// most the backward window of them on the device at once, autograd freeing each as it is used); or
// checkpoint (keep only the unit's input, recompute the forward before the backward), with
// checkpoint_offload the kept input on the host (fairscale checkpoint_wrapper offload_to_cpu: D2H on the
// copy stream after the forward, which frees the device copy; H2D when the backward reaches the unit,
// after the next unit's backward, with no prefetch: the recompute waits).
// Forward and backward workspaces are transient allocations of their task.
#include <algorithm>
#include <cmath>
#include <utility>

#include "context.h"
#include "zeroplan/profiles/activation_offload.h"
#include "zeroplan/sim/cost_models.h"

namespace zeroplan::sim::lowering {

// What a unit's forward holds on top of its saved bytes, which are allocated with the forward: the
// profiled forward peak counts everything the forward allocates (saved bytes but not the input, which
// was live before it, and the output), so the rest is peak - saved + input. The output of an inner unit
// is the next unit's input, counted in its saved bytes from the next forward on: here it is part of the
// workspace. The last unit's output has its own allocation (the loss keeps it), so it is taken out.
std::int64_t forward_workspace(const std::vector<Unit>& units, std::size_t i) {
  const Unit& x = units[i];
  const std::int64_t input = i > 0 ? units[i - 1].output : 0;
  const std::int64_t own_output = i + 1 == units.size() ? x.output : 0;
  return std::max<std::int64_t>(0, x.peak_fwd - x.saved + input - own_output);
}

std::int64_t recompute_workspace(const std::vector<Unit>& units, std::size_t i) {
  const Unit& x = units[i];
  if (i + 1 < units.size() || x.peak_recompute == x.peak_fwd) return forward_workspace(units, i);
  const std::int64_t input = i > 0 ? units[i - 1].output : 0;
  return std::max<std::int64_t>(0, x.peak_recompute - x.saved + input);
}

// Unit 0's input, the model's, was live before its forward as every later unit's input was (and is in
// its saved bytes once the forward ran): its forward holds it on top of the profiled peak. (A pipeline
// stage's first unit: its received activation, allocated by the pipeline piece.)
std::int64_t Activations::fwd_workspace(int u) const {
  const std::int64_t model_input = u == 0 && c_.stage < 0 ? c_.input0 : 0;
  return forward_workspace(c_.units, static_cast<std::size_t>(u)) + model_input;
}

void Activations::pick_offloaded() {
  const std::size_t n = c_.units.size();
  off_sizes_.assign(n, {});
  picked_.clear();
  off_bytes_.assign(n, 0);
  fwd_window_.assign(n, 0);
  bwd_window_.assign(n, 0);
  h2d_.assign(n, kNone);
  const double ratio = c_.plan.offload.activations_ratio;
  if (ratio <= 0 || n == 0 || keep_on_device_) return;
  if (c_.units[0].tensor_list) {
    std::vector<std::vector<std::int64_t>> lists;
    std::vector<bool> keeps;
    for (const Unit& x : c_.units) {
      lists.push_back(x.saved_tensors);
      keeps.push_back(!x.checkpoint);
    }
    picked_ = offloaded_tensors(lists, keeps, ratio);
    for (std::size_t i = 0; i < n; ++i) {
      const Unit& x = c_.units[i];
      for (std::size_t k = 0; k < picked_[i].size(); ++k) {
        if (!picked_[i][k]) continue;
        const double bytes = static_cast<double>(x.saved_tensors[k]) * x.saved_tensor_scale;
        off_sizes_[i].push_back(bytes);
        off_bytes_[i] += static_cast<std::int64_t>(std::llround(bytes));
      }
      off_bytes_[i] = std::min(off_bytes_[i], x.saved);
    }
    set_windows();
    return;
  }
  // No saved tensors in the profile (analytic): the ratio of what each kept unit saves beside its input
  // (which the unit keeps anyway), as one tensor.
  for (std::size_t i = 0; i < n; ++i) {
    const Unit& x = c_.units[i];
    if (x.checkpoint) continue;
    const std::int64_t input = i > 0 ? c_.units[i - 1].output : c_.input0;
    off_bytes_[i] = analytic_offloaded_bytes(x, input, ratio);
    if (off_bytes_[i] > 0) off_sizes_[i].push_back(static_cast<double>(off_bytes_[i]));
  }
  set_windows();
}

void Activations::set_windows() {
  const std::int64_t prefetch = c_.plan.offload.activations_prefetch_bytes;
  for (std::size_t i = 0; i < off_sizes_.size(); ++i) {
    std::vector<std::int64_t> sizes;
    for (double b : off_sizes_[i]) sizes.push_back(static_cast<std::int64_t>(std::llround(b)));
    fwd_window_[i] = std::min(off_bytes_[i], forward_window(sizes, prefetch));
    const Unit& x = c_.units[i];
    if (i < picked_.size() && off_bytes_[i] > 0 && !x.unpack_peaks.empty()) {
      // With the backward's timeline: what its copies back add to its peak, replayed (the window alone
      // undercounts when the peak comes after tensors came back and were freed).
      std::vector<std::int64_t> all;
      for (const std::int64_t b : x.saved_tensors) all.push_back(std::llround(static_cast<double>(b) * x.saved_tensor_scale));
      bwd_window_[i] = std::max<std::int64_t>(
          0, offloaded_backward_peak(all, picked_[i], x.unpack_order, x.unpack_peaks, prefetch) - x.peak_bwd);
    } else {
      bwd_window_[i] = std::min(off_bytes_[i], backward_window(sizes, prefetch));
    }
  }
}

namespace {
double copies_time(const ClusterProfile& cluster, CopyDir dir, const std::vector<double>& sizes) {
  double t = 0;
  for (double b : sizes) t += copy_time(cluster, dir, b);
  return t;
}
}  // namespace

void Activations::on_fwd(int u, int mb, TaskId fwd) {
  if (off_bytes_.empty()) pick_offloaded();
  if (pending_.empty()) {
    pending_.assign(c_.units.size(), kNone);
    offloaded_.assign(c_.units.size(), kNone);
    host_part_.assign(c_.units.size(), kNone);
    d2h_.assign(c_.units.size(), kNone);
    rng_.assign(c_.units.size(), kNone);
  }
  const auto i = static_cast<std::size_t>(u);
  const Unit& x = c_.units[i];
  if (u == 0) prev_fwd_ = let_go_ = kNone;
  // Activation offload: the previous unit's copies out are done before this forward (the executor's
  // compute thread waited for them when that forward ended).
  c_.g.add_dep(fwd, let_go_);
  let_go_ = kNone;
  const TaskId prev_fwd = std::exchange(prev_fwd_, fwd);
  if (i + 1 == c_.units.size()) last_fwd_ = fwd;
  // A checkpointed forward saves nothing: its peak is bounded by the profiled (grad-mode) one (the last
  // unit's output aside: the loss's allocation below; after the loss the output's gradient waits in
  // its place).
  const std::int64_t own_output = i + 1 == c_.units.size() ? x.output : 0;
  c_.g.alloc(fwd, c_.dev, x.checkpoint ? std::max<std::int64_t>(0, x.peak_fwd - own_output) : fwd_workspace(u),
             MemCategory::activations, c_.label(c_.n_workspace, u, mb));
  // The last unit's output (the logits) stays referenced until that unit's backward: the loss reads it
  // and the unit's backward starts from its gradient. Not in `saved` (the next unit's input is counted
  // there; the last unit has none), so one more output-sized tensor. The loss's own temporaries and the
  // logits' gradient are in the last unit's forward peak and saved bytes (the profiler measures them).
  if (i + 1 == c_.units.size())
    loss_ = c_.g.alloc(fwd, c_.dev, x.output, MemCategory::activations, c_.label(c_.n_saved, u, mb), kNone);
  if (x.checkpoint) {
    const std::int64_t input = u > 0 ? c_.units[i - 1].output : c_.input0;
    // The RNG state for the recompute stays with the unit whether or not its input goes to the host.
    if (c_.rng_state_bytes > 0)
      rng_[i] = c_.g.alloc(fwd, c_.dev, c_.rng_state_bytes, MemCategory::activations, c_.label(c_.n_input_kept, u, mb), kNone);
    if (!c_.plan.checkpoint_offload || input <= 0) {
      pending_[i] = c_.g.alloc(fwd, c_.dev, input, MemCategory::activations, c_.label(c_.n_input_kept, u, mb), kNone);
      return;
    }
    const TaskId d2h = c_.g.add_task(c_.d2h, copy_time(c_.cluster, CopyDir::d2h, static_cast<double>(input)),
                                     c_.label(c_.n_d2h, u, mb), {fwd}, c_.n_cat_copy);
    c_.g.alloc(fwd, c_.dev, input, MemCategory::activations, c_.label(c_.n_input_kept, u, mb), d2h);
    host_part_[i] = c_.g.alloc(d2h, c_.host, input, MemCategory::activations, c_.label(c_.n_input_kept, u, mb), kNone);
    d2h_[i] = d2h;
    return;
  }
  const std::int64_t off = off_bytes_[i];
  pending_[i] = c_.g.alloc(fwd, c_.dev, x.saved - off, MemCategory::activations, c_.label(c_.n_saved, u, mb), kNone);
  if (off <= 0) return;
  // The offloaded tensors are copied out on the copy lane as the forward saves them (beside it: after the
  // previous unit's forward), into host memory taken by the forward, at most the forward window of them
  // on the device at once;
  // the compute lane waits for the last copy when the forward ends (a zero-time task on it), which lets
  // the window go.
  // (The first unit of a microbatch has no forward before it here: its copies go after its own.)
  // On a GPU the compute thread waits on the host for each chosen tensor's copy (the CUDA side lane's
  // host-side wait, which frees every tensor as its copy lands), so the device's queue drains at each wait
  // and a unit's forward and its copies out add up: after the unit's own forward (on a lent H200,
  // ResNet-50 at batch 256, ratio 0.1: forward 40.4 ms at ratio 0, 78.4 ms with 37 ms of copies out).
  const bool serial = c_.cluster.device.kind == "cuda";
  const TaskId d2h = c_.g.add_task(c_.d2h, copies_time(c_.cluster, CopyDir::d2h, off_sizes_[i]), c_.label(c_.n_d2h, u, mb),
                                   {prev_fwd != kNone && !serial ? prev_fwd : fwd}, c_.n_cat_copy);
  const AllocId window = c_.g.alloc(fwd, c_.dev, fwd_window_[i], MemCategory::activations, c_.label(c_.n_saved_offloaded, u, mb), kNone);
  host_part_[i] = c_.g.alloc(fwd, c_.host, off, MemCategory::activations, c_.label(c_.n_saved_offloaded, u, mb), kNone);
  d2h_[i] = d2h;
  let_go_ = c_.g.add_task(c_.compute, 0.0, c_.label(c_.n_saved_offloaded, u, mb), {fwd, d2h}, c_.n_cat_compute);
  c_.g.set_free_at(window, let_go_);
  if (i + 1 == c_.units.size()) last_fwd_ = let_go_;
}

TaskId Activations::before_bwd(int u, int mb, TaskId params_ready) {
  const auto i = static_cast<std::size_t>(u);
  const Unit& x = c_.units[i];
  const auto n = static_cast<int>(c_.units.size());
  // Activation offload: the unit's tensors come back when its backward starts (after the next unit's),
  // at most the backward window of them on the device at once; the backward waits for the copies.
  if (off_bytes_[i] > 0 && !x.checkpoint) {
    const TaskId issue_after = u + 1 < n ? c_.bwd[i + 1] : backward_start_ != kNone ? backward_start_ : last_fwd_;
    h2d_[i] = c_.g.add_task(c_.h2d, copies_time(c_.cluster, CopyDir::h2d, off_sizes_[i]), c_.label(c_.n_h2d, u, mb),
                            {d2h_[i], issue_after, u + 1 < n ? kNone : last_fwd_}, c_.n_cat_copy);
    if (u + 1 == n) last_unit_h2d_ = h2d_[i];
    offloaded_[i] = c_.g.alloc(h2d_[i], c_.dev, bwd_window_[i], MemCategory::activations, c_.label(c_.n_saved_offloaded, u, mb), kNone);
    c_.g.set_free_at(host_part_[i], h2d_[i]);
  }
  if (x.checkpoint) {
    TaskId input_back = kNone;
    if (d2h_[i] != kNone) {  // checkpoint_offload: the input comes back when the backward reaches the unit
      const std::int64_t bytes = c_.g.allocs()[host_part_[i]].bytes;
      const TaskId after = i + 1 < c_.units.size() ? c_.bwd[i + 1] : kNone;
      input_back = c_.g.add_task(c_.h2d, copy_time(c_.cluster, CopyDir::h2d, static_cast<double>(bytes)),
                                 c_.label(c_.n_h2d, u, mb), {d2h_[i], after}, c_.n_cat_copy);
      pending_[i] = c_.g.alloc(input_back, c_.dev, bytes, MemCategory::activations, c_.label(c_.n_input_kept, u, mb), kNone);
      c_.g.set_free_at(host_part_[i], input_back);
    }
    const TaskId re = c_.compute_task(x.recompute_s, c_.n_recompute, u, mb);
    c_.g.add_dep(re, params_ready);
    c_.g.add_dep(re, input_back);
    // The recompute runs on the kept input (already allocated, so not again in the saved bytes, which
    // count every unit's input, the model's included): a forward's workspace, plus the output's
    // gradient, already waiting.
    const std::int64_t input = u > 0 ? c_.units[i - 1].output : c_.input0;
    c_.g.alloc(re, c_.dev, recompute_workspace(c_.units, i) + incoming_grad(u), MemCategory::activations,
               c_.label(c_.n_workspace, u, mb));
    offloaded_[i] = c_.g.alloc(re, c_.dev, std::max<std::int64_t>(0, x.saved - input), MemCategory::activations,
                               c_.label(c_.n_saved, u, mb), kNone);
    return re;
  }
  return h2d_[i];
}

// An inner unit's backward starts from the gradient of its output, computed by the next unit's
// backward (in that unit's peak) and held through this one; the output itself stays referenced as the
// root of this unit's graph until its backward ends, after the next unit freed its saved copy of it
// (recomputed, for a checkpointed unit).
// The last unit's output and its gradient are already held (the loss's allocation and its saved bytes).
std::int64_t Activations::incoming_grad(int u) const {
  const auto i = static_cast<std::size_t>(u);
  return i + 1 < c_.units.size() ? c_.units[i].output : 0;
}

void Activations::after_bwd(int u, int mb, TaskId bwd) {
  const auto i = static_cast<std::size_t>(u);
  c_.g.alloc(bwd, c_.dev, c_.units[i].peak_bwd + 2 * incoming_grad(u), MemCategory::activations,
             c_.label(c_.n_workspace, u, mb));
  c_.g.set_free_at(pending_[i], bwd);
  if (i + 1 == c_.units.size() && loss_ != kNone) {
    c_.g.set_free_at(loss_, bwd);
    loss_ = kNone;
  }
  if (offloaded_[i] != kNone) c_.g.set_free_at(offloaded_[i], bwd);
  if (rng_[i] != kNone) c_.g.set_free_at(rng_[i], bwd);
  pending_[i] = offloaded_[i] = host_part_[i] = d2h_[i] = rng_[i] = kNone;
  h2d_[i] = kNone;
}

}  // namespace zeroplan::sim::lowering
