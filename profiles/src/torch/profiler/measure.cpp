// The memory pass: one unit measured alone on its input (parameters, peak and saved bytes, FLOPs, the
// output for the next unit), as profile_model does for every unit at every batch, and profile_unit.
#include <torch/torch.h>
#include <zeroplan/config.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "internal.h"
#include "zeroplan/profiles/flops.h"
#include "zeroplan/profiles/saved_tensors.h"

namespace zeroplan::detail {
namespace {

// The backward's timeline (UnitProfile::bwd_unpack_order / _peaks): each time autograd first unpacks one
// of the unit's own saved tensors, the peak since the last one (above `base`, the bytes live before the
// backward) closes a segment. The meter's peak restarts at each, so the backward's peak is the largest.
struct Timeline {
  Timeline(Devices& dev, std::int64_t base, const std::vector<saved_tensors::SavedRef>& saved,
           const std::vector<std::size_t>& own)
      : base(base), dev_(dev) {
    for (std::size_t k = 0; k < own.size(); ++k) position_.emplace(saved[own[k]].key, static_cast<std::int64_t>(k));
  }
  void unpacked(const saved_tensors::SavedRef& r) {
    auto it = position_.find(r.key);
    if (it == position_.end() || !first_.insert(r.key).second) return;
    close();
    order.push_back(it->second);
  }
  // Closes the last segment: `peak` is the backward's, above `base`.
  void finish() {
    close();
    peak = *std::max_element(peaks.begin(), peaks.end());
  }
  std::int64_t base, peak = 0;
  std::vector<std::int64_t> order, peaks;

 private:
  void close() {
    peaks.push_back(dev_.memory.peak() - base);
    dev_.memory.begin_phase();
  }
  Devices& dev_;
  std::unordered_map<const void*, std::int64_t> position_;
  std::unordered_set<const void*> first_;
};

// One timed forward (with the loss for the last unit) and backward of `unit` on `input`: seconds each
// (profile_unit: a unit alone, timed in isolation).
std::pair<double, double> time_once(zoo::UnitModule& unit, const torch::Tensor& input,
                                    const std::vector<torch::Tensor>& grad_params, Devices& dev, const LossFn& loss,
                                    bool input_grad = true) {
  torch::Tensor x = input.detach();
  if (x.is_floating_point() && input_grad) x.requires_grad_(true);
  reset_grads(grad_params);
  dev.timer.start();
  torch::Tensor y = unit.forward(x);
  torch::Tensor g;
  if (loss && y.requires_grad()) {
    torch::Tensor z = y.detach().requires_grad_(true);
    g = torch::autograd::grad({loss(z)}, {z})[0];
  }
  const double fwd = dev.timer.stop_s();
  if (!g.defined()) g = torch::ones_like(y);
  dev.timer.start();
  if (y.requires_grad()) torch::autograd::backward({y}, {g});
  const double bwd = dev.timer.stop_s();
  reset_grads(grad_params);
  return {fwd, bwd};
}

}  // namespace

// Measures `unit` on `input`; returns the measurement and the (detached) output for the next unit.
// `grad_params`: every parameter whose gradient the unit's backward may write (own and borrowed).
// With `loss` (the last unit), the forward figures include the loss and its gradient: its time, its
// temporaries in the forward peak, and the output's gradient, held until the unit's backward, in the
// saved bytes; the backward starts from that gradient.
std::pair<UnitMeasurement, torch::Tensor> measure(zoo::UnitModule& unit, const torch::Tensor& input,
                                                  const std::vector<torch::Tensor>& grad_params,
                                                  const ProfileOptions& options, Devices& dev,
                                                  const LossFn& loss, bool time_it, const TracedPhase* traced,
                                                  bool input_grad) {
  UnitMeasurement m;
  for (const auto& p : unit.parameters()) {
    m.params += p.numel();
    m.bytes_param += static_cast<std::int64_t>(tensor_bytes(p));
  }
  for (const auto& b : unit.buffers()) m.bytes_buffer += static_cast<std::int64_t>(tensor_bytes(b));
  m.input_shape = shape_of(input);

  torch::Tensor x = input.detach();
  if (x.is_floating_point() && input_grad) x.requires_grad_(true);
  auto clear = [&] {
    reset_grads(grad_params);
    if (x.requires_grad()) x.mutable_grad() = torch::Tensor();
  };
  auto backward = [&](const torch::Tensor& y, const torch::Tensor& g) {
    if (y.requires_grad()) torch::autograd::backward({y}, {g});
  };
  // The gradient the unit's backward starts from: the loss's (computed here, part of the forward) or
  // ones for an inner unit (allocated outside the measured phases).
  auto output_grad = [&](const torch::Tensor& y) {
    if (!loss || !y.requires_grad()) return torch::ones_like(y);
    torch::Tensor z = y.detach().requires_grad_(true);
    torch::Tensor l = loss(z);
    return torch::autograd::grad({l}, {z})[0];
  };

  // Warm-up: lazy initialisation, thread pools, allocator state.
  for (int i = 0; i < options.warmup; ++i) {
    clear();
    torch::Tensor y = unit.forward(x);
    backward(y, output_grad(y));
  }

  // Memory pass. The unit runs on a fresh copy of its input, held until the unit's backward as the
  // executor holds every unit's input (the leaf it differentiates against), so what stays live after
  // forward, minus the output, is what autograd saved plus the input, counted once whether or not
  // autograd saved it (a unit that does not save its input, e.g. an in-place ReLU on a copy, or an
  // average pool, still keeps it alive in a training step).
  clear();
  torch::Tensor x_copy = x.clone();
  const double bytes_x_copy = tensor_bytes(x_copy);
  ProfilerTrace* trace = traced != nullptr ? dev.trace : nullptr;
  // The memory pass's phases in the trace: host wall time (the phases end with a synchronize).
  auto memory_phase = [&](const char* phase, double ts_us, std::int64_t live_before, std::int64_t peak = -1) {
    if (trace == nullptr) return;
    const double dur_s = (trace->begin_us() - ts_us) * 1e-6;
    trace->phase(ProfilerTrace::kMemoryTid, std::string(phase) + " " + traced->unit_name, ts_us, dur_s,
                 traced->args(phase), live_before, dev.memory.live(), peak >= 0 ? peak : dev.memory.peak());
  };
  dev.synchronize();
  const std::int64_t live0 = dev.memory.begin_phase();
  const double fwd_ts_us = trace != nullptr ? trace->begin_us() : 0;
  // The tensors autograd saves, recorded (their storages, not held) as the forward runs; those the unit
  // alone keeps are what activation offload chooses from.
  saved_tensors::Recorder saved;
  torch::Tensor y;
  {
    saved_tensors::Scope record(saved);
    y = unit.forward(x_copy);
  }
  // The storages the unit alone keeps, among those a forward on `in` giving `out` saved in `rec`.
  auto own_storages = [&](const saved_tensors::Recorder& rec, const torch::Tensor& in, const torch::Tensor& out) {
    std::vector<torch::Tensor> kept{in, out};
    for (const auto& p : grad_params) kept.push_back(p);
    for (const auto& p : unit.parameters()) kept.push_back(p);
    for (const auto& b : unit.buffers()) kept.push_back(b);
    return saved_tensors::distinct_storages(rec.saved(), kept, in.device().type());
  };
  const std::vector<std::size_t> own = own_storages(saved, x_copy, y);
  // The unit's backward from `g` (what `rec` saved in its forward, `unit_own` the unit's own storages among
  // them), its timeline taken from `rec`'s unpacks, above the bytes live when it starts.
  auto backward_timeline = [&](saved_tensors::Recorder& rec, const std::vector<std::size_t>& unit_own,
                               const torch::Tensor& out, const torch::Tensor& g) {
    dev.synchronize();
    Timeline timeline(dev, dev.memory.begin_phase(), rec.saved(), unit_own);
    rec.on_unpack = [&timeline](const saved_tensors::SavedRef& r) { timeline.unpacked(r); };
    backward(out, g);
    dev.synchronize();
    rec.on_unpack = nullptr;
    timeline.finish();
    return timeline;
  };
  for (std::size_t i : own) m.saved_tensors.push_back(saved.saved()[i].bytes);
  if (loss) {  // what a recompute of the unit (no loss) allocates
    dev.synchronize();
    m.bytes_peak_fwd_without_loss = static_cast<double>(dev.memory.peak() - live0);
  }
  torch::Tensor g_loss = loss ? output_grad(y) : torch::Tensor();
  dev.synchronize();
  const std::int64_t live1 = dev.memory.live();
  memory_phase("forward", fwd_ts_us, live0);
  x_copy = torch::Tensor();
  m.bytes_peak_fwd = static_cast<double>(dev.memory.peak() - live0);
  m.output_shape = shape_of(y);
  m.bytes_output = tensor_bytes(y);
  m.bytes_saved =
      std::max(0.0, static_cast<double>(live1 - live0) + bytes_x_copy - m.bytes_output);
  {
    torch::Tensor g = loss ? std::move(g_loss) : torch::ones_like(y);
    const double bwd_ts_us = trace != nullptr ? trace->begin_us() : 0;
    Timeline timeline = backward_timeline(saved, own, y, g);
    m.bytes_peak_bwd = static_cast<double>(timeline.peak);
    m.bwd_unpack_order = std::move(timeline.order);
    m.bwd_unpack_peaks = std::move(timeline.peaks);
    memory_phase("backward", bwd_ts_us, timeline.base, timeline.base + timeline.peak);
  }
  torch::Tensor output = y.detach();
  y = torch::Tensor();

  // The backward again with the gradients accumulated in place (bytes_peak_bwd_in_place): every
  // parameter's gradient exists before it, allocated outside the phase, so autograd adds each one it
  // makes into it and frees what it made, as the executor's backward does into its gradient region.
  {
    clear();
    for (const auto& p : grad_params) {
      if (p.requires_grad()) p.mutable_grad() = torch::zeros_like(p);
    }
    saved_tensors::Recorder again;
    torch::Tensor x_again = x.clone();
    torch::Tensor y_again;
    {
      saved_tensors::Scope record(again);
      y_again = unit.forward(x_again);
    }
    const std::vector<std::size_t> own_again = own_storages(again, x_again, y_again);
    x_again = torch::Tensor();
    torch::Tensor g = loss ? output_grad(y_again) : torch::ones_like(y_again);
    Timeline timeline = backward_timeline(again, own_again, y_again, g);
    m.bytes_peak_bwd_in_place = static_cast<double>(timeline.peak);
    // The same tensors unpacked in the same order (as they are: the same unit on the same input).
    if (timeline.order == m.bwd_unpack_order) m.bwd_unpack_peaks_in_place = std::move(timeline.peaks);
  }

  // FLOPs pass (the counter's callback keeps op inputs alive a little longer: not in the memory pass).
  {
    clear();
    flops::Count count;
    {
      flops::FlopCounter counter;
      torch::Tensor yf = unit.forward(x);
      count = counter.count();
    }
    m.flops_fwd = count.forward();
    m.flops_bwd = count.backward();
  }

  // Kernel time (CUDA with CUPTI): one more pass (also when the caller times the unit) with activity records on.
  if (dev.kernel_timer != nullptr) {
    clear();
    dev.kernel_timer->start();
    torch::Tensor yk = unit.forward(x);
    torch::Tensor g = loss ? output_grad(yk) : torch::Tensor();
    m.kernel_time_fwd_s = dev.kernel_timer->stop_s();
    if (!loss) g = torch::ones_like(yk);
    dev.kernel_timer->start();
    backward(yk, g);
    m.kernel_time_bwd_s = dev.kernel_timer->stop_s();
  }

  if (!time_it) {  // the caller times the unit in interleaved rounds (profile_model)
    clear();
    return {std::move(m), output};
  }
  // Timed passes.
  std::vector<double> fwd, bwd;
  for (int i = 0; i < options.repeats; ++i) {
    auto [f, b] = time_once(unit, x, grad_params, dev, loss, input_grad);
    fwd.push_back(f);
    bwd.push_back(b);
  }
  clear();
  const TimingStats sf = timing_stats(fwd), sb = timing_stats(bwd);
  m.time_fwd_s = sf.median_s;
  m.time_fwd_spread_s = sf.spread_s();
  m.time_bwd_s = sb.median_s;
  m.time_bwd_spread_s = sb.spread_s();
  return {std::move(m), output};
}


}  // namespace zeroplan::detail

namespace zeroplan {

UnitMeasurement profile_unit(zoo::UnitModule& unit, const at::Tensor& input,
                             const ProfileOptions& options) {
  detail::validate_options(options);
  detail::DeviceContext ctx(input.device());
  detail::Devices dev = ctx.devices();
  return detail::measure(unit, input, unit.parameters(), options, dev).first;
}

}  // namespace zeroplan
