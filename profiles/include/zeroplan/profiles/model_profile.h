// ModelProfile ("zeroplan.model_profile/1"): per-unit time and memory of one model, measured or derived.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "zeroplan/profiles/figure.h"

namespace zeroplan {

// One unit of the model (transformer block, ResNet stage, embedding, head): the grain at which
// strategies wrap, offload, checkpoint and profile. Shapes are at the profile's reference batch.
// Parameters a unit uses but another (earlier) unit owns: a tied embedding's weight in the head. The
// owner counts them; the borrower needs them gathered for its forward and backward, and its backward
// adds to the owner's gradient.
struct BorrowedParams {
  int unit = 0;              // index in ModelProfile::units of the owner (an earlier entry with count 1)
  std::int64_t params = 0;   // how many of the owner's parameters
  bool operator==(const BorrowedParams&) const = default;
};

// One kernel-level operation of a unit, for the per-op time model of units without measured times (the
// analytic GPT lists them). Sizes are at the profile's reference batch and scale linearly with the micro
// batch: a GEMM's m (its rows are tokens), an attention's batch, a memory-bound op's elements and bytes.
//   gemm       `batch` independent products C[m,n] = A[m,k] B[k,n] (a linear layer: m tokens, n outputs,
//              k inputs); backward dA = dC B^T (m,k,n) and dB = A^T dC (k,n,m); `bias`: the bias add is
//              fused in the epilogue, its gradient is a column sum of dC (m x n elements, memory-bound)
//   attention  softmax(Q K^T) V for `batch` = micro batch x heads, m = query length, n = key length,
//              k = head dim; `fused`: one flash kernel (causal skips the masked half), else unfused
//              (two batched GEMMs, the m x n score softmax and dropout as memory-bound kernels)
//   memory     elements read + written in the compute dtype (elems_*) plus dtype-independent bytes
//              (bytes_*: dropout masks, fp32 loss tensors), in kernels_* launches
struct UnitOp {
  std::string kind;  // "gemm" | "attention" | "memory"
  std::string name;  // "qkv", "fc1", "attention", "layernorm1"
  std::int64_t m = 0, n = 0, k = 0, batch = 1;  // gemm, attention
  bool bias = false;                            // gemm
  bool fused = false, causal = false, dropout = false;  // attention
  double elems_fwd = 0, elems_bwd = 0, bytes_fwd = 0, bytes_bwd = 0;  // memory
  int kernels_fwd = 0, kernels_bwd = 0;                               // memory

  bool operator==(const UnitOp&) const = default;
};

// A unit's times measured at another dtype than the profile's (its parameters and activations in that
// dtype): what a plan computing in that dtype takes, where the ratio of GEMM peaks would miss the
// element-wise ops, casts and gradient adds that do not speed up (or slow down) with it.
struct DtypeTimes {
  Figure time_fwd_s;
  Figure time_bwd_s;
  bool operator==(const DtypeTimes&) const = default;
};

struct UnitProfile {
  std::string name;                  // "block", "embed", "layer3"
  std::string type;                  // "Embedding", "TransformerBlock", "Linear", "Head", "ResNetStage"
  int count = 1;                     // identical repetitions (96 blocks = one entry, count 96); optional
  std::int64_t params = 0;           // parameters of ONE repetition (trainable)
  std::int64_t bytes_param = 0;      // bytes of those parameters in the profile's dtype
  std::int64_t bytes_buffer = 0;     // non-trainable buffers (BatchNorm stats); optional, default 0
  std::vector<std::int64_t> input_shape;   // at the reference batch
  std::vector<std::int64_t> output_shape;  // at the reference batch
  // Batch-dependent figures, each for ONE repetition.
  Figure bytes_saved;        // kept for backward: saved by autograd, plus the input (profiler.h)
  Figure bytes_output;       // the output activation
  Figure time_fwd_s;         // forward time: trimmed mean over the timed rounds (profile_model)
  Figure time_bwd_s;         // backward time: trimmed mean over the timed rounds (profile_model)
  Figure time_fwd_spread_s;  // spread (p90 - p10) of forward time; optional, default 0
  Figure time_bwd_spread_s;  // spread (p90 - p10) of backward time; optional, default 0
  Figure bytes_peak_fwd;     // transient peak during forward above what was live before it
  Figure bytes_peak_bwd;     // transient peak during backward above what was live before it
  // The same with the parameters' gradients accumulated in place into gradients that exist before the
  // backward (profiler.h): what the executor's backward allocates; optional, value 0 and absent from
  // the JSON when not measured (older profiles, analytic): bytes_peak_bwd stands in for it then.
  Figure bytes_peak_bwd_in_place;
  // The last unit is measured with the task's loss (profiler.h): its forward peak before the loss ran,
  // what a recompute of the unit allocates; optional, value 0 and absent from the JSON otherwise.
  Figure bytes_peak_fwd_without_loss;
  // The last unit's time_fwd_s includes the loss and its gradient: their part (a recompute of the unit
  // runs no loss); optional, value 0 and absent from the JSON otherwise.
  Figure time_loss_s;
  Figure flops_fwd;
  Figure flops_bwd;
  // Summed kernel durations of one forward / backward (CUDA with CUPTI only; the time_*_s above
  // include launch gaps, these do not); optional, value 0 and absent from the JSON when not measured.
  Figure kernel_time_fwd_s;
  Figure kernel_time_bwd_s;
  std::vector<BorrowedParams> borrowed;  // optional, default none
  // Whether a plan's checkpointing can recompute this unit: false for what is not a module of its own (a
  // Python model's root:pre, root:post and glue segments, which zeroplan.wrap cannot rerun alone); a plan's
  // checkpointing "all" or index list passes over such a unit. Optional, default true (absent from the
  // JSON then).
  bool recomputable = true;
  std::map<std::string, DtypeTimes> times_at_dtype;  // "bf16" -> times at bf16; optional, default none
  std::vector<UnitOp> ops;               // optional, default none: the unit's kernels (see UnitOp)
  // Bytes of each tensor autograd saves in the forward that the unit alone keeps (not its input, output,
  // parameters or buffers), one per storage, in the order saved, at the reference batch: what activation
  // offload chooses from (activation_offload.h). Optional: empty when not recorded (analytic, older).
  std::vector<std::int64_t> saved_tensors;
  // The backward's timeline at the reference batch, for activation offload (activation_offload.h):
  // positions in saved_tensors in the order the backward first unpacks them, and the backward's peak
  // above the bytes live before it (every saved tensor resident) before the first unpack and after each
  // (one more entry than the order), as bytes_peak_bwd and bytes_peak_bwd_in_place measure it.
  // Optional: empty when not recorded (analytic, older).
  std::vector<std::int64_t> bwd_unpack_order;
  std::vector<std::int64_t> bwd_unpack_peaks;
  std::vector<std::int64_t> bwd_unpack_peaks_in_place;

  bool operator==(const UnitProfile&) const = default;
};

struct ModelProfile {
  std::string name;       // "gpt2-tiny"
  std::string source;     // "zoo:gpt/gpt2-tiny", "torchscript:FILE", "analytic:gpt"
  bool measured = true;   // false for analytic profiles (figures derived, not timed)
  std::string device;     // "cpu", "cuda:0", or a device name ("NVIDIA A100-SXM4-80GB")
  std::string dtype;      // "fp32" | "fp16" | "bf16": dtype of parameters and activations measured
  int threads = 1;        // intra-op threads used while profiling
  // Processes' worth of the same unit computing at once while its times were taken (the run's local
  // ranks); 1: the unit alone, as older profiles were measured. Optional.
  int concurrent_ranks = 1;
  // The backward times include adding every parameter's gradient into an accumulation buffer, as the
  // executor does in every microbatch; false in older profiles. Optional.
  bool backward_adds_grads = false;
  // With concurrent_ranks > 1: how far the slowest of those ranks falls behind their mean over one
  // training step's compute started together, as a fraction of the step (mean over lock-step rounds of
  // (max - mean) / mean). Ranks sharing cores drift apart, and a collective starts when the last rank
  // issues it. 0: not measured. Optional.
  double rank_skew = 0;
  // Device bytes the libraries hold for the whole process once a step ran (cuBLAS's and cuBLASLt's
  // workspaces on CUDA, allocated through the caching allocator; cuda_init.h), so every run on that
  // device holds them beside the model. 0 on a CPU. Optional.
  std::int64_t device_library_bytes = 0;
  std::map<std::string, std::string> library_versions;  // {"torch": "2.15.0", "zeroplan": "0.1.0"}; optional
  int batch = 1;                              // reference micro batch: figures' `value`s are at this batch
  std::int64_t seq_len = 0;                   // sequence length (0 when not a sequence model); optional
  std::int64_t image_size = 0;                // image side (0 when not an image model); optional
  std::vector<std::int64_t> input_shape;      // model input at the reference batch, e.g. {8, 128}
  std::vector<int> profiled_batches;          // micro batches the fits were made from; optional
  std::vector<UnitProfile> units;             // in execution order
  std::vector<std::string> notes;             // what a user should know before trusting it; optional

  // Sum over units of params x count.
  std::int64_t total_params() const;
  // Sum over units of bytes_param x count.
  std::int64_t total_bytes_param() const;
  // Sum over units of count: units after expanding repetitions.
  int expanded_unit_count() const;
  // Sum over units of (time_fwd_s + time_bwd_s) x count at `micro_batch`.
  double total_compute_time_s(double micro_batch) const;

  bool operator==(const ModelProfile&) const = default;
};

inline constexpr const char* kModelProfileSchema = "zeroplan.model_profile/1";

// Records the unit times of `other` (the same model profiled at another dtype, same units in the same
// order) in `profile`'s units as times_at_dtype[other.dtype]. Throws SchemaError naming the first unit or
// field that differs (unit names and counts, device kind, threads, concurrent_ranks) or when the dtypes
// are the same.
void add_times_at_dtype(ModelProfile& profile, const ModelProfile& other);

// Throws SchemaError naming the field and the numbers. Checks: non-empty name/source/units,
// dtype known, batch >= 1, counts >= 1, params/bytes/times/FLOPs >= 0, bytes_param > 0 when params > 0,
// fit points >= 0, r2 <= 1, unit names unique, profiled_batches >= 1 and increasing.
void validate(const ModelProfile& profile);

// nlohmann ADL hooks. from_json is strict (unknown keys, missing keys, wrong schema are SchemaError)
// and validates.
void to_json(nlohmann::json& j, const ModelProfile& profile);
void from_json(const nlohmann::json& j, ModelProfile& profile);
void to_json(nlohmann::json& j, const UnitProfile& unit);
void to_json(nlohmann::json& j, const Figure& figure);

}  // namespace zeroplan
