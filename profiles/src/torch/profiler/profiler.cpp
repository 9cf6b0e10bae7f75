// The per-unit profiler (see profiler.h for what each figure means): profile_model drives a memory pass
// (measure.cpp: every unit at every batch alone), timing rounds (timing.cpp: whole training steps' compute,
// with the run's concurrent ranks), and the fits over batches (stats.cpp) into a ModelProfile with notes.
#include "zeroplan/profiles/profiler.h"

#include <torch/torch.h>
#include <torch/version.h>
#include <zeroplan/config.h>

#include <algorithm>
#include <optional>
#include <string>

#include "device.h"
#include "internal.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/host_heap.h"
#include "zeroplan/profiles/trace.h"
#include "zeroplan/profiles/zoo.h"

namespace zeroplan {
namespace {

// What the memory pass leaves for the timing rounds and the fits.
struct Pass {
  std::vector<int> batches;  // sorted, the reference batch among them
  std::size_t ref = 0;       // the reference batch's index
  std::vector<torch::Tensor> params;                        // every unit's parameters, in unit order
  std::vector<std::vector<UnitMeasurement>> measurements;   // [batch][unit]
  std::vector<std::vector<torch::Tensor>> inputs;           // [batch][unit]: the unit's input, for the rounds
  std::vector<detail::LossFn> losses;                       // [batch]: the task's loss for the last unit
};

std::vector<int> profiled_batches(const ProfileOptions& options) {
  std::vector<int> batches = options.batches.empty()
                                 ? std::vector<int>{options.batch, 2 * options.batch}
                                 : options.batches;
  if (std::find(batches.begin(), batches.end(), options.batch) == batches.end()) {
    batches.push_back(options.batch);
  }
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  return batches;
}

// Memory and FLOPs per batch, unit by unit (each unit's input is the previous one's output).
void memory_pass(zoo::Model& model, const ProfileOptions& options, const torch::Device& device, torch::Dtype dtype,
                 detail::DeviceContext& ctx, detail::ProfilerTrace* traced, Pass& pass, ModelProfile& profile) {
  const std::vector<int>& batches = pass.batches;
  const std::vector<torch::Tensor>& all_params = pass.params;
  auto& measurements = pass.measurements;
  auto& inputs = pass.inputs;
  auto& losses = pass.losses;
  for (int b : batches) {
    detail::Devices dev = ctx.devices();
    dev.trace = traced;
    zoo::Batch data = model.task->batch(static_cast<std::int64_t>(options.data_seed), 0, b);
    torch::Tensor x = data.input.to(device);
    if (x.is_floating_point()) x = x.to(dtype);
    if (b == options.batch) {
      profile.input_shape = detail::shape_of(x);
      const auto sample = model.task->sample_shape();
      if (sample.size() == 1 && !x.is_floating_point()) profile.seq_len = sample[0];
      if (sample.size() == 3) profile.image_size = sample[1];
    }
    std::vector<UnitMeasurement> row;
    std::vector<torch::Tensor> row_inputs;
    for (std::size_t i = 0; i < model.units.size(); ++i) {
      if (options.progress) {
        std::fprintf(stderr, "profile: batch %d unit %zu/%zu %s\n", b, i + 1, model.units.size(),
                     model.units[i].name.c_str());
      }
      detail::LossFn loss;
      if (i + 1 == model.units.size()) {
        torch::Tensor target = data.target.to(device);
        // In fp32 as the executor computes it (autocast's rule for losses): at a 16-bit dtype the fp32
        // copy of the logits and the loss's fp32 temporaries are part of the last unit's forward peak.
        loss = [&model, target](const torch::Tensor& y) { return model.task->loss(y.to(torch::kFloat32), target); };
      }
      try {
        row_inputs.push_back(x);
        if (loss) losses.push_back(loss);
        const detail::TracedPhase phase{model.units[i].name, static_cast<int>(i), b, -1};
        // The model's input never needs a gradient in a training step (the executor differentiates only
        // against later units' inputs): the first unit's backward computes none.
        auto [m, out] = detail::measure(*model.units[i].module, x, all_params, options, dev, loss, /*time_it=*/false, &phase,
                                /*input_grad=*/i > 0);
        row.push_back(std::move(m));
        x = out;
      } catch (const c10::Error& e) {
        throw SchemaError(c10::str("profile: unit ", model.units[i].name, " at batch ", b, " failed: torch: ",
                                   zoo::torch_cause(e)));
      }
    }
    measurements.push_back(std::move(row));
    inputs.push_back(std::move(row_inputs));
  }
}

// The times in `repeats` interleaved rounds (every batch and unit once per round), so a slow or fast
// spell of a shared machine spreads over all units instead of landing on some of them. Returns the notes
// on units whose times still spread after re-measuring.
std::vector<std::string> timing_rounds(zoo::Model& model, const ProfileOptions& options, int concurrent,
                                       detail::DeviceContext& ctx, detail::ProfilerTrace* traced, Pass& pass,
                                       ModelProfile& profile) {
  const std::vector<int>& batches = pass.batches;
  const std::vector<torch::Tensor>& all_params = pass.params;
  auto& measurements = pass.measurements;
  const auto& inputs = pass.inputs;
  const auto& losses = pass.losses;
  const std::size_t ref = pass.ref;
  std::vector<std::string> noisy_notes;
  detail::Devices dev = ctx.devices();
  dev.trace = traced;
  const std::size_t nb = batches.size(), nu = model.units.size();
  std::vector<std::vector<double>> fwd(nb * nu), bwd(nb * nu), loss_times(nb);
  // The backward as the executor runs it: every parameter's gradient added into a buffer.
  std::vector<torch::Tensor> accum = detail::zeroed_like(all_params);
  // The run's other local ranks, each running a training step at the batch being timed, started with
  // the timed one's (as a run's ranks start each step together after its collectives).
  std::optional<detail::ConcurrentRanks> others;
  if (concurrent > 1) {
    auto work = [&](int bi, std::vector<torch::Tensor>& acc) {
      const auto b = static_cast<std::size_t>(bi);
      detail::step_pass(model.units, inputs[b][0], losses[b], all_params, acc, nullptr, 0, 0, nullptr, nullptr);
    };
    others.emplace(concurrent - 1, options.threads, work, all_params);
  }
  // Timed in step order: one training step's forward and backward of every unit per batch and round.
  auto timed = [&](std::size_t bi, int repeat) {
    if (others) others->step(static_cast<int>(bi));
    std::vector<double> f(nu, 0.0), g(nu, 0.0);
    double l = 0;
    detail::step_pass(model.units, inputs[bi][0], losses[bi], all_params, accum, &dev, batches[bi], repeat, f.data(),
              g.data(), &l);
    loss_times[bi].push_back(l);
    for (std::size_t i = 0; i < nu; ++i) {
      fwd[bi * nu + i].push_back(f[i]);
      bwd[bi * nu + i].push_back(g[i]);
    }
  };
  for (int r = 0; r < options.repeats; ++r) {
    if (options.progress) std::fprintf(stderr, "profile: timing round %d/%d\n", r + 1, options.repeats);
    for (const std::size_t bi : round_order(nb, r)) timed(bi, r);
  }
  // A unit whose times spread over more than a quarter of their median (and over 0.2 ms: below that
  // the spread moves no step) has its batch measured again (as many steps more); if it still spreads,
  // the profile says so.
  auto noisy = [](const std::vector<double>& v) {
    const TimingStats t = timing_stats(v);
    return v.size() >= 3 && t.spread_s() > std::max(0.25 * t.median_s, 2e-4);
  };
  for (std::size_t bi = 0; bi < nb; ++bi) {
    bool again = false;
    for (std::size_t i = 0; i < nu; ++i) again = again || noisy(fwd[bi * nu + i]) || noisy(bwd[bi * nu + i]);
    if (!again) continue;
    for (int r = 0; r < options.repeats; ++r) timed(bi, options.repeats + r);
    for (std::size_t i = 0; i < nu; ++i) {
      const std::size_t k = bi * nu + i;
      for (auto [v, what] : {std::pair{&fwd[k], "forward"}, std::pair{&bwd[k], "backward"}}) {
        if (!noisy(*v)) continue;
        const TimingStats t = timing_stats(*v);
        noisy_notes.push_back(c10::str("unit ", model.units[i].name, " at batch ", batches[bi], ": ", what,
                                       " times spread ", static_cast<int>(100 * t.spread_s() / t.median_s),
                                       "% of their median (p10-p90 over ", v->size(),
                                       " samples, measured twice): the machine was busy; re-profile when it is quiet"));
      }
    }
  }
  if (others) {
    const std::string error = others->error();
    others.reset();
    if (!error.empty())
      throw SchemaError("profile: a concurrent rank's thread failed: " + error.substr(0, error.find('\n')));
    profile.rank_skew = detail::lock_step_skew(model.units, inputs[ref][0], losses[ref], all_params, concurrent,
                                       options.threads, std::max(10, 2 * options.repeats));
  }
  for (std::size_t bi = 0; bi < nb; ++bi) {
    for (std::size_t i = 0; i < nu; ++i) {
      UnitMeasurement& m = measurements[bi][i];
      // Trimmed means: a step sums its units' times, the slow samples included.
      const TimingStats sf = timing_stats(fwd[bi * nu + i]), sb = timing_stats(bwd[bi * nu + i]);
      m.time_fwd_s = sf.trimmed_mean_s;
      m.time_fwd_spread_s = sf.spread_s();
      m.time_bwd_s = sb.trimmed_mean_s;
      m.time_bwd_spread_s = sb.spread_s();
      if (i + 1 == nu) m.time_loss_s = timing_stats(loss_times[bi]).trimmed_mean_s;
    }
  }
  return noisy_notes;
}

// Unit i's profile: its figures at the reference batch with their fits over the batches; a time that falls
// as the batch grows adds a note.
UnitProfile unit_profile(const zoo::Model& model, std::size_t i, const Pass& pass, std::vector<std::string>& notes) {
  const std::vector<int>& batches = pass.batches;
  const std::vector<double> xs(batches.begin(), batches.end());
  const UnitMeasurement& r = pass.measurements[pass.ref][i];
  UnitProfile u;
  u.name = model.units[i].name;
  u.type = model.units[i].type;
  u.count = 1;
  u.params = r.params;
  u.bytes_param = r.bytes_param;
  u.bytes_buffer = r.bytes_buffer;
  u.input_shape = r.input_shape;
  u.output_shape = r.output_shape;
  auto figure = [&](double UnitMeasurement::*field) {
    std::vector<double> ys;
    for (const auto& row : pass.measurements) ys.push_back(row[i].*field);
    Figure f{r.*field, fit_linear(xs, ys), {}};
    for (std::size_t k = 0; k < xs.size(); ++k) f.measured.push_back({xs[k], ys[k]});
    std::sort(f.measured.begin(), f.measured.end());
    f.measured.erase(std::unique(f.measured.begin(), f.measured.end(),
                                 [](const auto& a, const auto& b) { return a[0] == b[0]; }),
                     f.measured.end());
    return f;
  };
  u.bytes_saved = figure(&UnitMeasurement::bytes_saved);
  u.bytes_output = figure(&UnitMeasurement::bytes_output);
  u.time_fwd_s = figure(&UnitMeasurement::time_fwd_s);
  u.time_bwd_s = figure(&UnitMeasurement::time_bwd_s);
  u.time_fwd_spread_s = figure(&UnitMeasurement::time_fwd_spread_s);
  u.time_bwd_spread_s = figure(&UnitMeasurement::time_bwd_spread_s);
  u.bytes_peak_fwd = figure(&UnitMeasurement::bytes_peak_fwd);
  u.bytes_peak_bwd = figure(&UnitMeasurement::bytes_peak_bwd);
  u.flops_fwd = figure(&UnitMeasurement::flops_fwd);
  u.flops_bwd = figure(&UnitMeasurement::flops_bwd);
  if (r.kernel_time_fwd_s > 0) u.kernel_time_fwd_s = figure(&UnitMeasurement::kernel_time_fwd_s);
  if (r.bytes_peak_bwd_in_place > 0) u.bytes_peak_bwd_in_place = figure(&UnitMeasurement::bytes_peak_bwd_in_place);
  if (r.bytes_peak_fwd_without_loss > 0)
    u.bytes_peak_fwd_without_loss = figure(&UnitMeasurement::bytes_peak_fwd_without_loss);
  if (r.time_loss_s > 0) u.time_loss_s = figure(&UnitMeasurement::time_loss_s);
  if (r.kernel_time_bwd_s > 0) u.kernel_time_bwd_s = figure(&UnitMeasurement::kernel_time_bwd_s);
  u.saved_tensors = r.saved_tensors;
  u.bwd_unpack_order = r.bwd_unpack_order;
  u.bwd_unpack_peaks = r.bwd_unpack_peaks;
  u.bwd_unpack_peaks_in_place = r.bwd_unpack_peaks_in_place;
  for (const zoo::BorrowedParam& b : model.units[i].borrowed) {
    const auto owned = model.units[static_cast<std::size_t>(b.owner_unit)].module->named_parameters();
    const torch::Tensor* p = owned.find(b.owner_name);
    TORCH_CHECK(p != nullptr, "unit ", u.name, " borrows ", b.owner_name, " which unit ", b.owner_unit, " does not have");
    auto same = std::find_if(u.borrowed.begin(), u.borrowed.end(), [&](const BorrowedParams& x) { return x.unit == b.owner_unit; });
    if (same == u.borrowed.end()) u.borrowed.push_back({b.owner_unit, p->numel()});
    else same->params += p->numel();
  }
  // A time that falls as the batch grows is noise, not a cost: the fit extrapolates it wrongly (a
  // fall over the profiled batches above 0.1 ms and a tenth of the value is flagged).
  for (auto [fig, what] : {std::pair{&u.time_fwd_s, "forward"}, std::pair{&u.time_bwd_s, "backward"}}) {
    const double fall_s = -fig->fit.per_sample * (batches.back() - batches.front());
    if (fig->fit.points >= 2 && fall_s > std::max(1e-4, 0.1 * fig->value)) {  // a fall that matters
      notes.push_back(c10::str("unit ", u.name, ": ", what, " time falls with the batch (",
                                       fig->fit.per_sample * 1e3, " ms per sample over batches ",
                                       c10::Join(",", batches), "): the machine was busy; re-profile when it is quiet"));
    }
  }
  return u;
}

}  // namespace

ModelProfile profile_model(zoo::Model& model, const ProfileOptions& options, TraceWriter* trace) {
  detail::validate_options(options);
  TORCH_CHECK(model.task != nullptr, "profile_model: model has no task");
  const torch::Dtype dtype = detail::parse_dtype(options.dtype);
  const torch::Device device = detail::parse_device(options.device);
  if (options.threads > 0) torch::set_num_threads(options.threads);
  retain_freed_host_memory();  // as every rank of a run does (host_heap.h)

  Pass pass;
  pass.batches = profiled_batches(options);
  pass.ref = static_cast<std::size_t>(
      std::find(pass.batches.begin(), pass.batches.end(), options.batch) - pass.batches.begin());
  for (auto& unit : model.units) detail::move_module(*unit.module, device, dtype);
  for (auto& unit : model.units) {
    for (auto& p : unit.module->parameters()) pass.params.push_back(p);
  }

  ModelProfile profile;
  profile.name = model.preset.empty() ? model.name : model.preset;
  profile.source = zoo::profile_source(model.name, model.preset);
  profile.measured = true;
  profile.dtype = options.dtype;
  profile.threads = torch::get_num_threads();
  // Ranks on GPUs compute on devices of their own: only CPU ranks share what a unit runs on.
  const int concurrent = device.is_cpu() ? options.concurrent_ranks : 1;
  profile.concurrent_ranks = concurrent;
  profile.backward_adds_grads = true;
  profile.library_versions = {{"torch", TORCH_VERSION}, {"zeroplan", ZEROPLAN_VERSION}};
  profile.batch = options.batch;
  profile.profiled_batches = pass.batches;
#if ZEROPLAN_HAVE_CUDA
  profile.device = device.is_cuda() ? detail::cuda_device_name(device.index()) : "cpu";
#else
  profile.device = "cpu";
#endif

  detail::DeviceContext ctx(device);
  profile.device_library_bytes = ctx.devices().memory.library_bytes();
  std::optional<detail::ProfilerTrace> profiler_trace;
  if (trace != nullptr) profiler_trace.emplace(*trace);
  detail::ProfilerTrace* traced = profiler_trace ? &*profiler_trace : nullptr;
  memory_pass(model, options, device, dtype, ctx, traced, pass, profile);
  const std::vector<std::string> noisy_notes = timing_rounds(model, options, concurrent, ctx, traced, pass, profile);
  for (std::size_t i = 0; i < model.units.size(); ++i) profile.units.push_back(unit_profile(model, i, pass, profile.notes));
  profile.notes.insert(profile.notes.end(), noisy_notes.begin(), noisy_notes.end());
  return profile;
}

}  // namespace zeroplan
