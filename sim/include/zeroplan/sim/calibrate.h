// Calibration of the time model on measured runs (`zeroplan calibrate`): fit a few physical terms of a
// ClusterProfile's `calibration` (cluster.h) so the simulator's step times match measured ones, on one
// part of the rows, and judge the fit on the others. The same code fits the shipped GPU files to a public
// table (MosaicML llm-foundry's MPT training benchmarks, profiles/data/calibration/) and a user's own
// RunRecords to their cluster file. No per-row or per-model factor: one value per term for all rows.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"

namespace zeroplan::sim {

// One measured step: the model, the cluster resolved to the run's nodes, the plan, the measured time.
struct CalibrationRow {
  std::string label;           // "7b seq 2048 x8 mb6"
  ModelProfile model;
  ClusterProfile cluster;      // its calibration is replaced by the one being fitted
  Plan plan;
  double measured_step_s = 0;  // > 0
  double tokens_per_gpu_step = 0;  // tokens one GPU trains per step (throughput rows; 0: not reported)
  bool held_out = false;       // judged only, never fitted
};

// The terms calibrate() can fit: the fields of Calibration, by name ("gemm_efficiency_scale", ...).
const std::vector<std::string>& calibration_term_names();
// A Calibration's term by name; throws SimError naming the known ones for another name.
double& calibration_term(Calibration& calibration, std::string_view name);
double calibration_term(const Calibration& calibration, std::string_view name);

// The terms fitted when none are named: for rows whose compute comes from ops on a GPU (analytic
// profiles), the per-op model's terms (GEMM efficiency and shape, attention, memory-bound bandwidth,
// kernel gaps, compute slowed by collectives); for rows with measured unit times, compute_time_scale
// and comm_time_scale.
std::vector<std::string> default_terms(const std::vector<CalibrationRow>& rows);

struct CalibrationOptions {
  std::vector<std::string> terms;  // empty: default_terms(rows)
  int threads = 1;                 // rows simulated at once
  int max_evaluations = 600;       // of the objective (every fitted row simulated once)
};

struct CalibratedRow {
  std::string label;
  bool held_out = false;
  double measured_s = 0;
  double before_s = 0;  // predicted with the starting calibration
  double after_s = 0;   // predicted with the fitted one
  double tokens_per_gpu_step = 0;
};

// |predicted - measured| / measured over a set of rows.
struct CalibrationErrors {
  int rows = 0;
  double median = 0;
  double worst = 0;
  std::string worst_label;
};

struct CalibrationResult {
  Calibration calibration;          // the starting one with the fitted terms replaced
  std::vector<std::string> terms;   // fitted
  std::vector<CalibratedRow> rows;  // in the order given
  CalibrationErrors fitted_before, fitted_after, held_out_before, held_out_after;
  int evaluations = 0;
};

// Fits `options.terms` of `start` minimising the mean squared log ratio of predicted to measured step
// time over the rows not held out: a bounded pattern search, each fitted term starting from its neutral
// value (1, or 0 for gemm_half_dim and kernel_gap_s), the other terms kept as `start` has them;
// deterministic, the same result for any thread count; fitted values rounded to three significant
// digits. CalibratedRow::before_s is predicted with the fitted terms neutral. Throws SimError when no row is to be fitted, a measured time is not positive,
// or a term is unknown.
CalibrationResult calibrate(const std::vector<CalibrationRow>& rows, const Calibration& start,
                            const CalibrationOptions& options = {});

// The errors of `rows`' before_s / after_s against measured_s, for the held-out rows or the others.
CalibrationErrors calibration_errors(const std::vector<CalibratedRow>& rows, bool held_out, bool after);

// What a step time means in the units training runs are published in: tokens per second per GPU
// (global_batch x the profile's seq_len per step, over world_size; 0 without a sequence length) and model
// FLOPs utilisation (the profile's forward and backward FLOPs of the global batch, no recompute, over
// world_size x the compute dtype's peak; 0 when the profile has no FLOPs).
struct Throughput {
  double tokens_per_s_per_gpu = 0;
  double mfu = 0;
};
Throughput throughput(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan, double step_time_s);

// One line naming the calibration terms a cluster carries and what they were fitted to (their
// provenance, up to its first parenthesis, and the commit it names), or "uncalibrated".
std::string calibration_label(const ClusterProfile& cluster);

// ---- the public table ------------------------------------------------------------------------------

// The rows of a "zeroplan.calibration_rows/1" document (llm-foundry's MPT benchmark table, read by
// scripts/calibration/read_llm_foundry.py) measured on `device` ("h100_80gb", "a100_80gb", "a100_40gb"):
// each row's model is the analytic mpt with the document's sizes, biases, learned positions of `seq` rows
// and flash attention at the row's micro batch in bf16; the plan FSDP FULL_SHARD (ZeRO-3, resharding after
// forward) or SHARD_GRAD_OP (ZeRO-2), bf16 parameters and compute with an fp32 master and AdamW, fp32
// gradient reduction (mp_mode DEFAULT) or bf16 (PURE), checkpointing as the row says, grad_accum
// microbatches; the cluster `cluster_name` resolved to gpus / 8 nodes; the measured step time the row's
// global batch in tokens over its throughput. Rows of the model sizes at odd positions of the document's
// "models" (350m, 1b, 7b, 30b) are held out. Throws SimError for a document of another schema, a device
// with no rows, or a row the analytic model does not count to the row's num_params.
std::vector<CalibrationRow> benchmark_rows(const nlohmann::json& doc, std::string_view device,
                                           std::string_view cluster_name);

// The shipped GPU cluster file each device of the table calibrates: h100_80gb -> h100-sxm-80gb,
// a100_80gb -> a100-sxm-80gb, a100_40gb -> a100-sxm-40gb; "" for another.
std::string cluster_for_benchmark_device(std::string_view device);

}  // namespace zeroplan::sim
