// Predicted vs measured: a Prediction next to a RunRecord, metric by metric -> Comparison; and the two
// Chrome traces overlaid in one file.
//
//   Comparison c = compare(prediction, record, CompareOptions{}.set_model(&profile));
//   c.verdict                      // "pass" | "fail" | "within noise" | "not judged: machine busy (...)"
//   std::string t = overlay_traces(predicted_trace_json, measured_trace_json);
//
// Metrics (rel_error = (predicted - measured) / measured, so negative = the simulator is optimistic):
//   step_time_s                    gating (time tolerance). Measured: step_time_median_s; with LocalSGD
//                                  the mean of the measured steps (the prediction amortises averaging).
//   device_peak_bytes.rank<r>      gating (memory tolerance). Predicted: device.peak_bytes (allocations,
//   host_peak_bytes.rank<r>        without allocator overhead; every rank alike) vs each rank's peak. A
//                                  pool that both sides put under memory_floor_bytes does not gate.
//   phase.<name>_s                 informational unless gate_phases. The simulator's resources and units
//                                  mapped onto the executor's phases (RunRecord::phase_times_s):
//     phase.forward_s      sum of units' fwd_s x chunks   <-> "forward" (unit forwards and the loss)
//     phase.backward_s     sum of units' bwd_s x chunks   <-> "backward" (without recompute)
//     phase.compute_s      busy "compute"                 <-> forward + backward + recompute
//                                                              (+ optimizer unless offload.optimizer)
//     phase.optimizer_s    busy "host_optimizer"          <-> "optimizer"  (offload.optimizer only)
//     phase.h2d_s          busy "h2d"                     <-> "h2d"
//     phase.d2h_s          busy "d2h"                     <-> "d2h"
//     phase.comm_s         busy "comm" + "comm.*"         <-> all_reduce + all_gather + reduce_scatter
//                                                              (+ broadcast, reduce, all_to_all, barrier)
//     phase.exposed_comm_s exposed_comm_s                 <-> "comm_wait" (compute waiting on collectives)
//   chunks = microbatches (offload_model.microbatches with OffloadModel): the unit timings are of the
//   first microbatch. A phase is compared when either side has it, and skipped when neither does.
//   units[*]: fwd_s, bwd_s of each unit both sides name (per microbatch: the run's RunRecord::units,
//   the loss in the last unit's forward and a recompute in neither, as the simulator's unit tasks);
//   never gating. Predicted units the run did not measure, when it measured any, are a warning.
#pragma once

#include <string>

#include "zeroplan/profiles/comparison.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/prediction.h"
#include "zeroplan/profiles/run_record.h"

namespace zeroplan::sim {

struct CompareOptions {
  double time_tolerance = 0.10;    // largest |rel_error| of step time (the document's tolerance)
  double memory_tolerance = 0.05;  // largest |rel_error| of a peak (each memory metric's own tolerance)
  bool gate_phases = false;        // phases also decide the verdict (at time_tolerance)
  std::int64_t memory_floor_bytes = 1 << 20;  // pools under this on both sides do not gate
  int max_error_sources = 5;       // length of largest_error_sources
  // The profile the prediction was simulated from, for the checks it enables (threads per rank, fitted
  // batch range, library versions, device). Not owned; nullptr: those checks are skipped, with a warning.
  const ModelProfile* model = nullptr;
  std::string zeroplan_version;    // of this build, checked against the run's; "" skips the check
  // Other programs' load (cores, RunEnvironment.other_load_cores) above which the step time is not
  // judged; 0: a quarter of a core or a tenth of the machine's cores, whichever is more.
  double busy_load_cores = 0;
  bool noise_floor = true;         // weigh the step time against the run's spread and the machine's load

  CompareOptions& set_time_tolerance(double v) { time_tolerance = v; return *this; }
  CompareOptions& set_memory_tolerance(double v) { memory_tolerance = v; return *this; }
  CompareOptions& set_gate_phases(bool v) { gate_phases = v; return *this; }
  CompareOptions& set_model(const ModelProfile* v) { model = v; return *this; }
  CompareOptions& set_zeroplan_version(std::string v) { zeroplan_version = std::move(v); return *this; }
  CompareOptions& set_busy_load_cores(double v) { busy_load_cores = v; return *this; }
  CompareOptions& set_noise_floor(bool v) { noise_floor = v; return *this; }
};

// The Comparison of one prediction with one run (Comparison::predicted/measured, the documents' paths,
// are left for the caller). Largest error sources are ranked by the error's share of its headline
// figure: a time metric's |predicted - measured| over the measured step time (a unit's times its
// chunks), a memory metric's over the measured peak of that pool. Warnings name every way the two
// documents disagree that invalidates the comparison (different plan or model, threads per rank,
// micro batch outside the profiled range, library versions, device, noisy or fallback-using runs).
// REQUIRES: both documents valid (read_document validates). Throws SchemaError if a tolerance <= 0.
Comparison compare(const Prediction& prediction, const RunRecord& record, const CompareOptions& options = {});

struct OverlayOptions {
  // The measured step aligned with the predicted one: -1 = the first step after warm-up (spans carry
  // args.step and args.warmup, as the executor writes them); traces without steps align at their
  // first span.
  int measured_step = -1;
};

// One Chrome trace with two processes: pid 1 "predicted" and pid 2 "measured" (process_name and
// process_sort_index metadata), every event of both inputs kept with its tid and its pid rewritten
// (the inputs' own process_name/process_sort_index events are replaced). Times are shifted so that the
// predicted step and the chosen measured step start at the same ts, and no ts is negative. Accepts
// the object form ({"traceEvents": [...]}) and the bare array form. Throws SchemaError naming which
// trace ("predicted trace: ...", "measured trace: ...") is not valid trace JSON.
std::string overlay_traces(const std::string& predicted_trace_json, const std::string& measured_trace_json,
                           const OverlayOptions& options = {});

}  // namespace zeroplan::sim
