#include "context.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "zeroplan/sim/cost_models.h"
#include "zeroplan/sim/errors.h"

namespace zeroplan::sim::lowering {

Bytes bytes_of(const Plan& plan) {
  Bytes b;
  b.param = dtype_bytes(plan.precision.param_dtype);
  b.grad = b.param;
  b.reduce = dtype_bytes(plan.precision.reduce_dtype);
  b.master = plan.precision.master_fp32 && b.param != 4 ? 4 : 0;
  // fp32 state beside an fp32 master or fp32 params; 16-bit params without a master keep it in their dtype.
  b.states = (b.param == 4 || plan.precision.master_fp32 ? 4 : b.param) * plan.optimizer.states_per_param();
  b.compute = dtype_bytes(plan.precision.compute_dtype);
  return b;
}

// A profile's figure at a micro batch, in bytes: fitted lines extrapolate far (a per-sample slope of 4e17
// bytes at micro batch 32 is 1.3e19, past int64), so every figure saturates at 1 PiB (2^50) instead of
// wrapping to a small number that "fits": a saturated unit never fits a device, and sums of thousands
// of them stay far inside int64.
std::int64_t saturated_bytes(double v) {
  constexpr double kMax = static_cast<double>(std::int64_t{1} << 50);
  if (!(v > 0)) return 0;  // NaN and negatives: nothing
  return v >= kMax ? std::int64_t{1} << 50 : static_cast<std::int64_t>(v);
}

std::vector<Unit> expand_units(const ModelProfile& model, const Plan& plan, const ClusterProfile* cluster) {
  const int n = plan.data_parallel_size();
  const Bytes b = bytes_of(plan);
  const bool om = plan.offload_model.enabled;
  const double batch = om ? static_cast<double>(plan.micro_batch) / plan.offload_model.microbatches : plan.micro_batch;
  const double ref = model.batch;
  // Activations scale with the compute dtype relative to the profiled one.
  const double act_scale = static_cast<double>(b.compute) / dtype_bytes(model.dtype);
  const bool tensor_lists = std::any_of(model.units.begin(), model.units.end(),
                                        [](const UnitProfile& u) { return !u.saved_tensors.empty(); });
  std::vector<Unit> units;
  units.reserve(static_cast<std::size_t>(model.expanded_unit_count()));
  std::vector<int> first_expanded;  // profile index -> expanded index of its first repetition
  for (int i = 0; i < static_cast<int>(model.units.size()); ++i) {
    const UnitProfile& up = model.units[static_cast<std::size_t>(i)];
    Unit u;
    u.profile_index = i;
    u.params = up.params;
    u.shard = (up.params + n - 1) / n;
    u.padded = u.shard * n;
    u.tensors = param_tensors(up);
    if (cluster != nullptr) {
      const ComputeTime t = unit_compute_time(model, i, *cluster, batch, plan.precision.compute_dtype);
      u.fwd_s = t.fwd_s;
      u.bwd_s = t.bwd_s;
      // The loss runs in fp32 whatever the compute dtype: the profile's loss time as measured.
      const double loss_s = up.time_loss_s.value > 0 && t.from_profile ? up.time_loss_s.at(batch, ref) : 0.0;
      u.recompute_s = std::clamp(t.fwd_s - loss_s, 0.0, t.fwd_s);
    }
    auto bytes = [&](const Figure& f) { return saturated_bytes(std::max(0.0, f.at(batch, ref)) * act_scale); };
    u.buffer = saturated_bytes(static_cast<double>(up.bytes_buffer) * b.param / dtype_bytes(model.dtype));
    u.saved = bytes(up.bytes_saved);
    u.output = bytes(up.bytes_output);
    u.peak_fwd = bytes(up.bytes_peak_fwd);
    u.peak_recompute = u.peak_fwd;
    if (up.bytes_peak_fwd_without_loss.value > 0) {
      // The last unit's loss runs in fp32 whatever the compute dtype (autocast's rule), so what it adds to
      // the forward peak does not scale with the dtype; the unit's own part does (measured on a small GPT:
      // the loss's share 12.58 MB in an fp32 profile, 12.57 MB in a bf16 one).
      const double whole = std::max(0.0, up.bytes_peak_fwd.at(batch, ref));
      const double own = std::max(0.0, up.bytes_peak_fwd_without_loss.at(batch, ref));
      u.peak_recompute = saturated_bytes(own * act_scale);
      u.peak_fwd = saturated_bytes(static_cast<double>(u.peak_recompute) + std::max(0.0, whole - own));
    }
    u.grads_in_place = up.bytes_peak_bwd_in_place.value > 0 && plan.grads_in_place();
    const Figure& bwd_peak = u.grads_in_place ? up.bytes_peak_bwd_in_place : up.bytes_peak_bwd;
    u.peak_bwd = bytes(bwd_peak);
    const auto& unpack_peaks = u.grads_in_place ? up.bwd_unpack_peaks_in_place : up.bwd_unpack_peaks;
    if (!unpack_peaks.empty() && !up.bwd_unpack_order.empty() && bwd_peak.value > 0) {
      // Measured at the reference batch in the profile's dtype, scaled as the figure is.
      const double scale = static_cast<double>(u.peak_bwd) / bwd_peak.value;
      u.unpack_order = up.bwd_unpack_order;
      u.unpack_peaks.clear();
      for (const std::int64_t p : unpack_peaks) u.unpack_peaks.push_back(std::llround(static_cast<double>(p) * scale));
    }
    u.saved_tensors = up.saved_tensors;
    u.saved_tensor_scale = batch / ref * act_scale;
    u.tensor_list = tensor_lists;
    u.checkpoint = up.recomputable && plan.checkpointing.applies_to(i);
    first_expanded.push_back(static_cast<int>(units.size()));
    for (int r = 0; r < up.count; ++r) {
      u.rep = up.count > 1 ? r : -1;
      units.push_back(u);
      for (const BorrowedParams& b : up.borrowed) {
        const int o = first_expanded[static_cast<std::size_t>(b.unit)];
        units[static_cast<std::size_t>(o)].pinned = true;
        // The backward runs in reverse: the owner's gradient starts at its latest borrower's backward.
        for (Unit& earlier : units) std::erase(earlier.owners_due, o);
        units.back().owners_due.push_back(o);
        units.back().borrows.emplace_back(o, b.params);
      }
    }
  }
  return units;
}

Ctx::Ctx(const ModelProfile& mp, const ClusterProfile& cp, const Plan& p, const SimOptions& o)
    : model(mp), cluster(cp), plan(p), opt(o), own_graph_(std::make_unique<TaskGraph>()), g(*own_graph_) {
  if (plan.world_size > cluster.world_size()) {
    throw SimError(fmt::format("simulate: plan world_size {} > cluster {} nodes x {} devices (= {})", plan.world_size,
                               cluster.nodes, cluster.devices_per_node, cluster.world_size()));
  }
  n = plan.data_parallel_size();
  m = plan.microbatches;
  b = bytes_of(plan);
  units = expand_units(model, plan, &cluster);
  // About what a step's schedule adds per unit and microbatch (forward, backward, gathers, copies,
  // reduce-scatters and their waits; their allocations and dependencies): one allocation of each list.
  const std::size_t unit_mbs = units.size() * static_cast<std::size_t>(std::max(1, m)) + 16;
  g.reserve(12 * unit_mbs, 14 * unit_mbs, 10 * unit_mbs);
  for (const Unit& u : units) total_params += u.params;
  if (!model.input_shape.empty() && model.batch > 0) {
    std::int64_t numel = 1;
    for (const std::int64_t d : model.input_shape) numel *= d;
    // Token ids are int64; images come in the compute dtype (the executor casts them, as the profiler).
    const int elem = model.seq_len > 0 && model.image_size == 0 ? 8 : b.compute;
    // OffloadModel runs the micro batch in chunks (as expand_units sizes the units).
    const int batch = plan.offload_model.enabled ? plan.micro_batch / plan.offload_model.microbatches : plan.micro_batch;
    input0 = numel / model.batch * batch * elem;
  }
  if (cluster.device.kind == "cpu") rng_state_bytes = 5056;
  const bool has_ops = std::any_of(model.units.begin(), model.units.end(), [](const UnitProfile& u) { return !u.ops.empty(); });
  if (!measured_on_device_kind(model, cluster) && has_ops) {
    notes.push_back(fmt::format("compute times summed over each unit's ops: GEMMs (tile and wave quantisation, efficiency "
                                "by shape), attention, memory-bound kernels, launches (profile measured on \"{}\"{}, "
                                "cluster device kind \"{}\")",
                                model.device, model.measured ? "" : ", analytic", cluster.device.kind));
  } else if (!measured_on_device_kind(model, cluster)) {
    notes.push_back(fmt::format("compute times from a roofline of FLOPs where the profile has them (profile measured "
                                "on \"{}\"{}, cluster device kind \"{}\")",
                                model.device, model.measured ? "" : ", analytic", cluster.device.kind));
  }
  // A profile that measured the last unit without its loss lets the loss's fp32 temporaries keep their size
  // (expand_units); an older or analytic one scales them with the rest.
  const bool loss_apart = !model.units.empty() && model.units.back().bytes_peak_fwd_without_loss.value > 0;
  if (dtype_bytes(plan.precision.compute_dtype) < dtype_bytes(model.dtype) && !loss_apart) {
    notes.push_back(fmt::format("activations scaled from the profile's {} to {}, the loss's temporaries too, which a run "
                                "keeps in fp32: the device peak can be predicted low by up to a quarter when the logits "
                                "dominate (measured -20 to -25% on a small GPT); profile at the plan's dtype "
                                "(zeroplan profile --dtype {})",
                                model.dtype, plan.precision.compute_dtype, plan.precision.compute_dtype));
  }
  notes.push_back("parameter tensors per unit estimated from the unit type (for launch overheads)");
  fwd.assign(units.size(), kNone);
  fwd0.assign(units.size(), kNone);
  bwd0.assign(units.size(), kNone);
  bwd.assign(units.size(), kNone);
  compute_factor_ = compute_time_factor(model, cluster);
  intern_names();
}

Ctx::Ctx(Ctx& whole, int stage_index, int first, int count)
    : model(whole.model), cluster(whole.cluster), plan(whole.plan), opt(whole.opt), g(whole.g), stage(stage_index),
      unit_offset(first), prefix(fmt::format("s{}.", stage_index)), n(whole.n), m(whole.m), b(whole.b) {
  const auto begin = whole.units.begin() + first;
  units.assign(begin, begin + count);
  input0 = first > 0 ? whole.units[static_cast<std::size_t>(first - 1)].output : whole.input0;
  rng_state_bytes = whole.rng_state_bytes;
  for (Unit& u : units) {
    std::vector<int> local;
    for (const int o : u.owners_due)
      if (o >= first && o < first + count) local.push_back(o - first);
    u.owners_due = std::move(local);
    // Shared parameters whose owner runs on an earlier stage: this stage holds a replica of the borrowed
    // parameters (as Megatron keeps the tied word embeddings on the first and the last stage, and the
    // executor's pipeline piece does), so they count as its own: the borrowed tensor, not the owner unit.
    for (const auto& [o, params] : u.borrows) {
      if (o >= first) continue;
      u.replica_params += params;
      u.params += params;
      u.shard = (u.params + n - 1) / n;
      u.padded = u.shard * n;
    }
  }
  for (const Unit& u : units) total_params += u.params;
  fwd.assign(units.size(), kNone);
  fwd0.assign(units.size(), kNone);
  bwd0.assign(units.size(), kNone);
  bwd.assign(units.size(), kNone);
  compute_factor_ = compute_time_factor(model, cluster);
  intern_names();
}

// Interned names are shared: a stage's view gets the same ids as the whole model's.
void Ctx::intern_names() {
  n_fwd = g.intern("fwd");
  n_bwd = g.intern("bwd");
  n_recompute = g.intern("recompute");
  n_allgather = g.intern("all_gather");
  n_reduce_scatter = g.intern("reduce_scatter");
  n_all_reduce = g.intern("all_reduce");
  n_h2d = g.intern("h2d");
  n_d2h = g.intern("d2h");
  n_optimizer = g.intern("optimizer");
  n_saved = g.intern("saved activations");
  n_saved_offloaded = g.intern("offloaded activations");
  n_input_kept = g.intern("checkpointed input");
  n_workspace = g.intern("workspace");
  n_gathered = g.intern("gathered params");
  n_full_grads = g.intern("unsharded grads");
  n_grad_acc = g.intern("accumulate grads");
  n_bucket = g.intern("bucket");
  n_temp = g.intern("collective temporary");
  n_rs_output = g.intern("reduce-scatter output");
  n_rs_wait = g.intern("wait reduce-scatter");
  n_rs_add = g.intern("add reduce-scattered");
  n_params = g.intern("params");
  n_grads = g.intern("grads");
  n_master = g.intern("fp32 master params");
  n_states = g.intern("optimizer states");
  n_slowmo = g.intern("slowmo momentum and previous params");
  n_reduce_buffers = g.intern("reduce buffers");
  n_loss_scale = g.intern("loss scale check");
  n_zero_grad = g.intern("zero_grad");
  n_cast = g.intern("cast");
  n_gather_bucket = g.intern("all-gather bucket");
  n_param_sync = g.intern("param sync");
  n_cat_compute = g.intern("compute");
  n_cat_comm = g.intern("comm");
  n_cat_copy = g.intern("copy");
  n_cat_optimizer = g.intern("optimizer");
  n_library = g.intern("library workspaces");
  n_model_buffers = g.intern("model buffers");
}

std::string Ctx::unit_name(int u) const {
  const Unit& x = units[static_cast<std::size_t>(u)];
  const std::string& name = model.units[static_cast<std::size_t>(x.profile_index)].name;
  return x.rep >= 0 ? fmt::format("{}[{}]", name, x.rep) : name;
}

TaskId Ctx::compute_task(double s, NameId name, int u, int mb) {
  last_compute = g.add_task(compute, s * compute_factor_, label(name, u, mb), {}, n_cat_compute);
  return last_compute;
}

double Ctx::collective_s(CollOp op, double bytes, int ranks, CollAlgo algo, std::string_view dtype) {
  // Few distinct questions (a model's unit sizes): the last answer with the same hash, else a linear scan.
  auto same = [&](const KnownCollective& k) {
    return k.op == op && k.algo == algo && k.ranks == ranks && k.bytes == bytes && k.dtype == dtype;
  };
  const std::uint64_t key = std::bit_cast<std::uint64_t>(bytes) ^ (static_cast<std::uint64_t>(op) << 56) ^
                            (static_cast<std::uint64_t>(ranks) << 24) ^ static_cast<std::uint64_t>(algo);
  std::uint32_t& recent = recent_collectives_[(key * 0x9E3779B97F4A7C15ULL) >> 60];
  if (recent > 0 && same(known_collectives_[recent - 1])) return known_collectives_[recent - 1].s;
  for (std::size_t i = 0; i < known_collectives_.size(); ++i) {
    if (!same(known_collectives_[i])) continue;
    recent = static_cast<std::uint32_t>(i + 1);
    return known_collectives_[i].s;
  }
  CollectiveOptions o;
  o.algo = algo;
  o.dtype = std::string(dtype);
  const double s = collective_time(cluster, op, bytes, ranks, o);
  known_collectives_.push_back({op, algo, ranks, bytes, std::string(dtype), s});
  recent = static_cast<std::uint32_t>(known_collectives_.size());
  return s;
}

}  // namespace zeroplan::sim::lowering
