// The per-unit profiler: measures a zoo model unit by unit and writes a ModelProfile.
//
// Each unit runs on a detached input leaf (requires_grad when floating point), so its autograd graph is
// its own: what it saves for backward is what stays live after its forward minus its output. Memory on
// the CPU comes from a CountingAllocator installed for the duration; on CUDA from the caching
// allocator's statistics (and times from CUDA events plus CUPTI kernel records when built with CUPTI).
//
// Per unit and batch (figures of ONE repetition):
//   bytes_output     the output tensor's bytes (numel * itemsize)
//   bytes_saved      bytes a training step keeps from the unit's forward to its backward, parameters
//                    excluded: what autograd saves plus the unit's input, counted once (the executor
//                    holds every unit's input until the unit's backward, saved or not; the convention of
//                    Korthikanti et al. when the input is saved; the output is excluded, being the next
//                    unit's input). Measured as: live bytes after a forward on a fresh copy of the
//                    input, held through the measurement, minus live bytes before the forward, plus
//                    the copy, minus bytes_output.
//   bytes_peak_fwd   peak during forward - live before forward
//   bytes_peak_bwd   peak during backward - live before backward (includes the parameter gradients and
//                    the input gradient it allocates; gradients are reset to none before each pass)
//   bytes_peak_bwd_in_place  the same with every parameter's gradient allocated before the backward
//                    (zeros, outside the phase), so autograd adds each gradient into it as it is made
//                    and frees what it made: the executor's in-place accumulation into the flat gradient
//                    region (pieces::differentiate). A second forward and backward of the memory pass.
//   bwd_unpack_order, bwd_unpack_peaks(_in_place)   both backwards' timeline: the unit's own saved
//                    tensors in the order first unpacked and the peak (as above) before the first and
//                    after each, from the saved-tensor hooks' unpack (UnitProfile; activation offload)
//   time_fwd_s / time_bwd_s         median over `repeats` after `warmup` iterations
//   time_*_spread_s                 p90 - p10 of the same samples (linear interpolation)
//   flops_fwd / flops_bwd           see flops.h
//   kernel_time_fwd_s / _bwd_s      CUDA with CUPTI only: summed kernel durations of one more pass
// The last unit is measured with the task's loss after it, as a training step runs it: its forward
// figures include computing the loss and the output's gradient (time, temporaries in bytes_peak_fwd;
// the gradient, held until the unit's backward, in bytes_saved), and its backward starts from that
// gradient. A profile without the loss would miss the largest transient of a model with a big vocabulary.
// Every figure is fitted over the profiled batches (least squares: intercept + per_sample * batch);
// `value` is the measurement at the reference batch.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "zeroplan/profiles/figure.h"
#include "zeroplan/profiles/model_profile.h"

namespace at {
class Tensor;
}  // namespace at
namespace zeroplan {

class TraceWriter;

namespace zoo {
struct Model;
class UnitModule;
}  // namespace zoo

struct ProfileOptions {
  int batch = 4;               // reference micro batch: figures' `value`s are at this batch
  std::vector<int> batches;    // batches to fit over; empty = {batch, 2 * batch}; batch is added if missing
  int warmup = 2;              // untimed iterations per unit and batch
  int repeats = 5;             // timed iterations per unit and batch (median and p10..p90)
  int threads = 0;             // torch::set_num_threads; 0 = leave torch's current setting
  std::string device = "cpu";  // "cpu" | "cuda" | "cuda:N"
  std::string dtype = "fp32";  // "fp32" | "fp16" | "bf16": parameters and floating inputs
  std::uint64_t data_seed = 0; // step index of the task batch that feeds unit 0
  bool progress = false;       // one line per unit and batch on stderr
  // Times under the run's conditions: while a unit is timed, concurrent_ranks - 1 more threads (each
  // with `threads` intra-op threads) run the same unit's forward and backward, as the run's other local
  // ranks compute at once. 1: the unit alone. Recorded as ModelProfile::concurrent_ranks.
  int concurrent_ranks = 1;
};

// Profiles every unit of `model`. The model's units are moved to options.device and options.dtype in
// place. Fills name (preset or model name), source "zoo:<model>[/<preset>]", device, dtype, threads,
// library_versions {torch, zeroplan}, batch, seq_len / image_size (inferred from the task's sample
// shape: one integer dimension = tokens of a sequence, (C,H,W) = image), input_shape,
// profiled_batches and units. Throws SchemaError for bad options (naming the value), OutOfMemoryError
// never (no limit is set).
// With `trace`, the profiling run is also written to it (Chrome trace, trace.h): on pid 0, one span per
// unit's forward and backward in every timed round (tid 0, args unit, unit_name, batch, phase, repeat)
// and in the memory pass (tid 1), each with "memory device" counters (the memory meter's live bytes
// and the phase's peak) at its start and end.
ModelProfile profile_model(zoo::Model& model, const ProfileOptions& options, TraceWriter* trace = nullptr);

// One unit on a given input (at the input's batch), for tests and tools; figures are not fitted
// (Figure::constant of the measurement). The unit must already be on the input's device and dtype.
struct UnitMeasurement {
  std::int64_t params = 0;
  std::int64_t bytes_param = 0;
  std::int64_t bytes_buffer = 0;
  std::vector<std::int64_t> input_shape;
  std::vector<std::int64_t> output_shape;
  double bytes_output = 0;
  double bytes_saved = 0;
  double bytes_peak_fwd = 0;
  double bytes_peak_bwd = 0;
  double bytes_peak_bwd_in_place = 0;  // gradients accumulated in place (see above)
  double bytes_peak_fwd_without_loss = 0;  // measured with a loss (the last unit): the peak before it ran
  std::vector<std::int64_t> saved_tensors;  // UnitProfile::saved_tensors, at this batch
  // UnitProfile::bwd_unpack_order / _peaks / _peaks_in_place, at this batch
  std::vector<std::int64_t> bwd_unpack_order, bwd_unpack_peaks, bwd_unpack_peaks_in_place;
  double time_fwd_s = 0, time_fwd_spread_s = 0;
  double time_bwd_s = 0, time_bwd_spread_s = 0;
  double time_loss_s = 0;  // the last unit: median seconds of the loss and its gradient (in time_fwd_s)
  double flops_fwd = 0, flops_bwd = 0;
  // CUDA with CUPTI only (0 otherwise): summed kernel durations of one forward / backward, saved as the
  // ModelProfile's kernel_time_*_s; the event times above include launch gaps, these do not.
  double kernel_time_fwd_s = 0, kernel_time_bwd_s = 0;
};
UnitMeasurement profile_unit(zoo::UnitModule& unit, const at::Tensor& input,
                             const ProfileOptions& options);

// The order in which timing round `round` visits the n (batch, unit) pairs (index batch x units + unit):
// each round starts one pair later and odd rounds run backwards, so that no unit always follows the
// same one (its caches, its allocations) or always falls at the same point of a slow spell.
std::vector<std::size_t> round_order(std::size_t n, int round);

// Least-squares line through (batches[i], values[i]); r2 = 1 when the values are exactly linear
// (or constant); one point gives a line through the origin.
Fit fit_linear(const std::vector<double>& batches, const std::vector<double>& values);

// The table of hfai.utils.profile_memory: module name, type, parameter size, activation (saved) size,
// #calls (count), input shape, output shape, peak mem (forward), forward time, backward time; then
// totals (parameters, saved activations, time per step at the reference batch).
void print_profile_table(const ModelProfile& profile, std::FILE* out);

}  // namespace zeroplan
