// The executor's pieces (pieces.h lists them): The inputs, the units, the comm tracker, what every driver refuses, the compute scope and the recompute contract (context.cpp, autograd_step.cpp).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../comm_tracker.h"
#include "zeroplan/exec/communicator.h"
#include "zeroplan/exec/device.h"
#include "zeroplan/exec/flat_params.h"
#include "zeroplan/exec/loss_scaler.h"
#include "zeroplan/exec/optimizer.h"
#include "zeroplan/exec/recorder.h"
#include "zeroplan/profiles/activation_offload.h"
#include "zeroplan/profiles/pipeline.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/profiles/run_record.h"
#include "zeroplan/profiles/saved_tensors.h"
#include "zeroplan/profiles/zoo.h"

namespace zeroplan::exec::pieces {

// A parameter of an earlier unit that this unit uses too (tied weights).
struct Borrow {
  int owner = 0;
  std::int64_t offset = 0;  // in the owner's flat parameter
  std::int64_t numel = 0;
  torch::Tensor param;      // the owner's parameter (the tensor the borrower uses)
};

// Pipelines: a weight this unit uses whose owner runs on another stage (the tied embedding on the last
// stage). The stage holds its own copy as a parameter of this unit (Megatron's layout, what the simulator
// counts); the Pipeline piece sends its gradient to the owner and copies the owner's update back.
struct TiedReplica {
  int owner = 0;             // the owner's unit index in the whole model
  std::string owner_name;    // the parameter's name in the owner
  std::int64_t offset = 0;   // in this unit's flat parameter
  std::int64_t numel = 0;
};

struct UnitRT {
  std::string name;
  std::shared_ptr<zoo::UnitModule> module;
  FlatParams flat;
  std::vector<Borrow> borrows;
  std::vector<TiedReplica> replicas;  // pipelines: copies of weights owned on another stage
  ShardLayout layout;
  std::int64_t base = 0;        // region of the unit in full-size flat buffers (padded sizes, unit order)
  std::int64_t shard_base = 0;  // region of this rank's shard in shard-size buffers
  bool checkpoint = false;
  bool pinned = false;          // stays gathered from forward to its backward (unit 0, owners of borrows)
  torch::Tensor full;           // full (padded) flat parameters the unit computes with

  std::int64_t numel() const { return flat.numel(); }
  std::int64_t shard() const { return layout.shard_numel; }
  // Where `rank`'s shard starts in the unit's flat buffer (stage 0: one shard, the whole unit, at 0).
  std::int64_t shard_begin(int rank) const { return layout.shard_begin(layout.world == 1 ? 0 : rank); }
};

// The dtype of each copy of the model states and of each collective (the simulator's bytes_of).
struct Dtypes {
  torch::ScalarType param = torch::kFloat32;           // compute copy: flat buffers, shards, gathered units
  torch::ScalarType grad = torch::kFloat32;            // gradients: the param dtype
  torch::ScalarType all_reduce = torch::kFloat32;      // stages 0-1: reduce_dtype
  torch::ScalarType reduce_scatter = torch::kFloat32;  // stages 2-3: fp32 with fp32_reduce_scatter, else reduce_dtype
  torch::ScalarType param_sync = torch::kFloat32;      // stages 1-2 all-gather: fp16 with broadcast_fp16
  torch::ScalarType compute = torch::kFloat32;         // activations
  torch::ScalarType state = torch::kFloat32;           // optimizer state: fp32 unless 16-bit params without master
  bool master = false;    // fp32 master shard beside 16-bit params (master_fp32, fairscale's _fp32_shard)
  bool autocast = false;  // 16-bit compute: units run under autocast to it
};
Dtypes dtypes_of(const Plan& plan);  // precision.cpp; the combinations it cannot run are run rules (knobs.h)

// What every driver refuses before it builds anything (context.cpp): a knob the registry marks as not run,
// an invalid plan, a world size other than the ranks running it, a plan that breaks one of the registry's
// run rules (knobs.h run_rules: 16-bit LocalSGD, AdaScale with loss scaling, ...). ExecError.
void check_runnable(const Plan& plan, int world_size);
// Call from a catch block (context.cpp): an ExecError goes on as it is; a refused device allocation becomes
// OutOfDeviceMemory and any other torch error UnitFailure, both naming the unit and phase `c` is at (torch's
// own cause in one line, never its backtrace); anything else is rethrown unchanged. `c` may be null (setup).
class Ctx;
[[noreturn]] void rethrow_unit_error(const Ctx* c, const Device& dev);

// Unit forwards (and recomputes) in the compute dtype: autocast while alive when Dtypes::autocast.
class ComputeScope {
 public:
  ComputeScope(const Dtypes& dt, at::DeviceType device);
  ~ComputeScope();
  ComputeScope(const ComputeScope&) = delete;
  ComputeScope& operator=(const ComputeScope&) = delete;

 private:
  bool on_ = false, was_enabled_ = false;
  at::DeviceType device_;
  torch::ScalarType was_dtype_ = torch::kBFloat16;
};

// The checkpointing contract around a recompute (torch.utils.checkpoint's preserve_rng_state): a forward
// run without its graph is recomputed under the RNG state it started from, the caller's state going on
// after the recompute; buffers the recompute updates a second time (BatchNorm's running statistics) are
// put back once the backward ran (the recompute's graph holds them until then). One per checkpointed
// unit (Activations), slice and chunk (OffloadModel) or pipeline microbatch (executor.cpp).
class Recompute {
 public:
  void save_rng(Device& dev) { rng_ = dev.rng_state(); }  // at the forward
  // While alive: the forward's RNG state, the caller's again when it ends; `modules`' buffers kept (for
  // restore_buffers) once the state is switched.
  class Replay {
   public:
    Replay(Recompute& r, Device& dev, const std::vector<std::shared_ptr<zoo::UnitModule>>& modules = {});
    ~Replay() { dev_.set_rng_state(caller_rng_); }
    Replay(const Replay&) = delete;
    Replay& operator=(const Replay&) = delete;

   private:
    Device& dev_;
    torch::Tensor caller_rng_;
  };
  void drop_rng() { rng_ = torch::Tensor(); }  // the forward's state, once no recompute needs it
  // After the backward: the kept buffers back (a no-op when none were kept), the forward's state dropped.
  void restore_buffers();

 private:
  torch::Tensor rng_;
  std::vector<std::shared_ptr<zoo::UnitModule>> modules_;
  std::vector<torch::Tensor> kept_;  // the modules' buffers before the recompute, in their order
};

// The model's units this rank runs: all of them, or one pipeline stage's.
struct StageUnits {
  int first = 0;
  int count = -1;           // -1: to the end
  bool input_grad = false;  // the first unit's input needs its gradient (it came from an earlier stage)
};

class Ctx {
 public:
  // Flattens each unit's parameters and lays out shards over `world` ranks when the plan shards anything.
  // With a stage: only its units, the parameters of the others released (a pipeline rank holds its
  // stage); `comm` is then the stage's data-parallel group.
  Ctx(zoo::Model& model, const Plan& plan, Communicator& comm, Device& dev, Recorder& rec, int ranks_per_node,
      const StageUnits& stage = {});

  zoo::Model& model;
  const Plan plan;
  Communicator& comm;
  Device& dev;
  Recorder& rec;
  CommTracker tracker;
  int rank = 0, world = 1;
  int ranks_per_node = 1;         // consecutive ranks that share a node (divides world)
  std::vector<UnitRT> units;
  int first_unit = 0;        // the model's index of units[0]
  bool input_grad = false;   // StageUnits::input_grad
  std::int64_t padded_total = 0;  // sum of the units' padded sizes
  std::int64_t shard_total = 0;   // sum of the units' shard sizes (this rank's share)
  Dtypes dt;
  // dt.master: this rank's shard of the fp32 parameters as built (shard-size buffer, shard_base regions),
  // taken by OptimizerStep as its master before ParamResidency rounds the parameters to 16 bits.
  torch::Tensor master_init;
  // Where ranks agree across the whole world (the loss scaler's skip): `comm`, or with pipeline stages
  // every stage's ranks.
  Communicator* world_comm = nullptr;
  std::string cur_unit = "all", cur_phase = "setup";  // what an error names

  UnitRT& unit(int u) { return units[static_cast<std::size_t>(u)]; }
  const UnitRT& unit(int u) const { return units[static_cast<std::size_t>(u)]; }
  int unit_count() const { return static_cast<int>(units.size()); }
  void at(const std::string& unit_name, const char* phase) {
    cur_unit = unit_name;
    cur_phase = phase;
  }
  bool host_optimizer() const { return plan.optimizer_on_host(); }

  torch::Tensor dzeros(std::int64_t n, torch::ScalarType t = torch::kFloat32) const;
  torch::Tensor dempty(std::int64_t n, torch::ScalarType t = torch::kFloat32) const;
  torch::Tensor hzeros(std::int64_t n, torch::ScalarType t = torch::kFloat32) const;
  torch::Tensor hempty(std::int64_t n, torch::ScalarType t = torch::kFloat32) const;
};

}  // namespace zeroplan::exec::pieces
