// The training step: a unit-partitioned model run under a Plan on one rank of a Communicator.
//
// Forward and backward go unit by unit; each unit's input is a detached leaf, so each unit has its own
// autograd graph and the executor decides per unit when parameters are gathered, freed and prefetched,
// when gradients are reduced, and when activations are recomputed. Parameters live in flat buffers
// (flat_params.h); the optimizer (optimizer.h) steps on this rank's flat shard.
//   stage 0: bucketed all-reduce of gradients as units finish backward (last microbatch only).
//   stage 1: same all-reduce; each rank steps its shard; shards all-gathered per unit.
//   stage 2: per-unit reduce-scatter in backward (every microbatch), only the shard kept.
//   stage 3: parameters sharded; all-gather before each unit's forward and backward (the next one
//            prefetched), freed after use when reshard_after_forward; unit 0 and owners of tied
//            weights stay gathered through the microbatch (FSDP's root); reduce-scatter as stage 2.
// Offload: master shard, gradient shard and optimizer state in the host pool; the step runs there.
// LocalSGD / SlowMo (stage 0) and AdaScale (SGD): see exec/src/step/localsgd.cpp and adascale.cpp.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zeroplan/exec/communicator.h"
#include "zeroplan/exec/device.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/exec/loss_scaler.h"
#include "zeroplan/exec/recorder.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/profiles/run_record.h"
#include "zeroplan/profiles/zoo.h"

namespace zeroplan::exec {

struct StepStats {
  double time_s = 0;
  double loss = 0;  // mean loss over this rank's samples of the step
  double loss_scale = 1;  // what the loss gradient was multiplied by (1 without loss scaling)
  bool skipped = false;   // non-finite gradients on some rank: parameters and optimizer state untouched
  double lr_gain = 1;     // AdaScale's gain this step (1 without AdaScale)
  // Pipeline stages: this rank's compute time (forward, recompute, backward, loss) and the time from the
  // step's start to the end of its last backward; 1 - busy / span is its share of the bubble.
  double pipeline_busy_s = 0, pipeline_span_s = 0;
  std::map<std::string, double> phase_s;
};

struct ExecOptions {
  // Consecutive ranks sharing a node (LocalSGD reduces gradients within it every step and averages
  // parameters across nodes); 0: every rank on one node. Must divide the world size.
  int ranks_per_node = 0;
};

class Executor {
 public:
  // Takes over the model's parameters (they become views of flat buffers). Throws ExecError when the
  // plan asks for something this executor does not run (names it) or disagrees with the
  // communicator's world size; OutOfDeviceMemory when setting up exceeds the device limit.
  // model, comm, device and recorder must outlive the executor.
  Executor(zoo::Model& model, const Plan& plan, Communicator& comm, Device& device, Recorder& recorder,
           const ExecOptions& options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // One optimizer step on training step `step` of the task (samples of the global batch split
  // across ranks and microbatches). Throws OutOfDeviceMemory, CommError.
  StepStats step(std::int64_t step);

  // Checkpoints (collective): this rank's shard of the parameters, master and optimizer state, RNG,
  // buffers and loss scale into dir/step-<step>/ (then rank 0's manifest); and from dir's newest
  // checkpoint, resharded for this run's ranks, returning its step. Throws ExecError.
  void save_checkpoint(const std::string& dir, std::int64_t step);
  // other_run: resume a checkpoint of another run identity (model, seed, global batch) all the same.
  std::int64_t load_checkpoint(const std::string& dir, bool other_run = false);

  // Every parameter, full and in unit order ("unit.name" names); collective at stage 3.
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters();

  // Introspection for tests.
  std::int64_t optimizer_shard_numel() const;  // this rank's elements stepped by the optimizer
  int all_reduce_buckets() const;              // buckets per sync (stages 0-1)
  int units_with_params() const;               // F
  bool views_valid() const;                    // every resident unit's parameters are flat views
  LossScaler& loss_scaler();                   // precision.loss_scale's scaler (tests set its interval)
  int first_unit() const;                      // the model's index of this rank's first unit (pipelines)
  int pipeline_stage() const;                  // this rank's pipeline stage; -1 without pipeline stages
  // Activation offload's picks per unit of this rank's last microbatch (empty without it).
  std::vector<OffloadedActivations> offloaded_activations() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The features of a plan the executor does not run (empty when it runs all of them).
std::vector<std::string> unsupported_features(const Plan& plan);

}  // namespace zeroplan::exec
