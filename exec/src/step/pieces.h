// The executor's pieces, named like the simulator's lowering pieces (sim/src/lowering/context.h) where the
// concern is the same. Each owns one concern and decides the zero stage for it once, in its constructor;
// the step driver (executor.cpp) asks them what to do per unit and microbatch:
//   Ctx             the inputs, the units (flat parameters, shard layouts, borrowed weights), the comm
//                   tracker, and the unit/phase an error is reported against             (context.cpp)
//   ParamResidency  where parameters live: one full flat buffer (stages 0-2) or this rank's shard, gathered
//                   and released around each unit's forward and backward (stage 3)   (params_residency.cpp)
//   GradSync        where gradients accumulate and how ranks agree on them: bucketed all-reduce (stages
//                   0-1), per-unit reduce-scatter into this rank's shard (stages 2-3)         (dp_sync.cpp)
//   Activations     one microbatch's activations per unit: kept, or checkpointed and recomputed
//                                                                                       (activations.cpp)
//   ActivationOffload  a ratio of the kept ones' saved tensors to the host on the side lane and back
//                   before their unit's backward                                (activation_offload.cpp)
//   OptimizerStep   the optimizer state and the step on the device or the host, and the updated
//                   parameters back where ParamResidency keeps them                    (optimizer_step.cpp)
//   Precision       the dtype of every copy (Dtypes, in Ctx), the loss scale, and whether the ranks
//                   agree to skip a step with non-finite gradients                          (precision.cpp)
//   ReplicaSync     LocalSGD and SlowMo: which ranks reduce gradients each step, the periodic parameter
//                   average and the slow momentum update                                  (localsgd.cpp)
//   AdaScale        fairscale's AdaScale gain from the gradient variance across ranks       (adascale.cpp)
//   Checkpoint      this rank's shard of the model and optimizer states to disk and back, resharded
//                   when the number of ranks changed                                     (checkpoint.cpp)
//   OffloadModel    fairscale OffloadModel: slices of consecutive units visit the device one at a time,
//                   their gradients carried to the host; the micro batch in chunks, slice-boundary
//                   activations on the host with checkpoint_activation; its own schedule  (offload_model.cpp)
//   Pipeline        pipeline stages: which units this rank runs, the schedule's order, activations and
//                   their gradients to and from the neighbouring stages, tied weights across stages, the
//                   loss from the last stage                                                (pipeline.cpp)
// and what every step driver does alike: a unit's backward, the loss, the model's input, the RNG state and
// buffers around a recompute (Recompute)                                              (autograd_step.cpp).
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

#include "comm_tracker.h"
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
Dtypes dtypes_of(const Plan& plan);  // precision.cpp; throws ExecError for combinations it cannot run

// What every driver refuses before it builds anything (context.cpp): a knob the registry marks as not run,
// an invalid plan, a world size other than the ranks running it, AdaScale with LocalSGD. ExecError.
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
  // The optimizer steps on the host: offload.optimizer, or OffloadModel (everything lives there).
  bool host_optimizer() const { return plan.offload.optimizer || plan.offload_model.enabled; }

  torch::Tensor dzeros(std::int64_t n, torch::ScalarType t = torch::kFloat32) const;
  torch::Tensor dempty(std::int64_t n, torch::ScalarType t = torch::kFloat32) const;
  torch::Tensor hzeros(std::int64_t n, torch::ScalarType t = torch::kFloat32) const;
};

class ParamResidency {
 public:
  // Moves every unit's parameters into the flat storage. OffloadModel: the flat buffer is on the host and
  // each unit's device buffer (UnitRT::full) is freed; the OffloadModel piece fills it when a slice visits.
  explicit ParamResidency(Ctx& c);
  void before_fwd(int u, int micro);           // u (and the owners it borrows from) gathered; next prefetched
  void after_fwd(int u);                       // resharded after forward unless pinned
  void before_bwd(int u, int micro);
  void after_bwd(int u);                       // released after its backward

  bool sharded() const { return sharded_; }    // stage 3: parameters sharded across ranks
  bool on_host() const { return on_host_; }    // OffloadModel: flat() is on the host
  // Stages 0-2: the full flat parameters of every unit (on the host with OffloadModel). Stage 3: this
  // rank's shard (host with offload.params).
  torch::Tensor& flat() { return sharded_ ? shard_all_ : flat_all_; }
  // This rank's chunk of unit u's current parameters (a view of flat()).
  torch::Tensor chunk(int u);
  // Every parameter, full, "unit.name" (gathers and releases at stage 3: collective).
  std::vector<std::pair<std::string, torch::Tensor>> full_copy();
  bool views_valid() const;

 private:
  void gather(int u, int micro);   // start unit u's all-gather (no-op when gathered or in flight)
  void ensure(int u, int micro);   // gathered, waiting for it
  void release(int u);
  Ctx& c_;
  bool sharded_ = false;
  bool on_host_ = false;
  torch::Tensor flat_all_, shard_all_;
  std::vector<char> gathered_;
  std::vector<CommTracker::Handle> gathers_;
  std::vector<torch::Tensor> gather_src_;
};

class GradSync {
 public:
  explicit GradSync(Ctx& c);
  void zero();                                  // before the step's first microbatch
  torch::Tensor region(int owner);              // where unit owner's gradient accumulates this microbatch
  void after_bwd(int u, int micro, bool last_micro);  // launches the unit's (or its bucket's) collective
  void finish_microbatch();                     // stages 2-3: this microbatch's reductions in the shard
  void finish_step();                           // every collective waited: gradients final
  // Final gradients: this rank's chunk of unit u (stage 0: all of it, also full()); shard(): stages 2-3,
  // the gradient shard (host with offload.grads).
  torch::Tensor& full() { return grad_all_; }
  // Stages 0-1: the communicator that all-reduces gradients this step (nullptr: none, each rank keeps
  // its own; ReplicaSync decides for LocalSGD). Stages 2-3 always reduce-scatter over every rank.
  void set_all_reduce_comm(Communicator* comm) { all_reduce_comm_ = comm; }
  // Sum of the squares of the final gradients on this rank's share: summed over ranks, the squared norm
  // of the whole gradient (stages 0-1 hold all of it on every rank: their share is 1/world of it).
  torch::Tensor sqr_norm_share();
  torch::Tensor chunk(int u);
  // On the device it exists from the step's first reduce-scatter landing until release() after the
  // optimizer step (FSDP2's sharded .grad under zero_grad(set_to_none=True), DeepSpeed's averaged
  // gradient partition): not held through the forward. With offload.grads it stays on the host.
  torch::Tensor& shard();
  void release();
  int buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    int lo = 0, hi = 0;  // units [lo, hi], launched when unit lo finished backward
    std::int64_t offset = 0, numel = 0;
  };
  // Stages 2-3: units with parameters grouped in backward order until reduce_buffer_elems (stage 3:
  // one each); shards laid out in that order in the bucket's output.
  struct RsBucket {
    std::vector<int> units;
    std::vector<std::int64_t> offsets;  // per unit: where its shard starts in the bucket's output
    std::int64_t padded = 0, shard = 0;
  };
  struct PendingReduce {
    int bucket;
    CommTracker::Handle handle;
    torch::Tensor input, output, source;  // source: the gradient input was cast from (held as long)
  };
  struct CastBucket {  // reduce_dtype != grad dtype: the bucket's cast copy, copied back once reduced
    CommTracker::Handle handle;
    torch::Tensor view, wire;
  };
  void finish_cast_bucket();
  void launch_reduce_scatter(int bucket, torch::Tensor input, int micro);
  void drain(std::size_t keep);  // waits all but the newest `keep` reduce-scatters, adds them to the shard
  Ctx& c_;
  bool transient_shard_ = false;  // stages 2-3 on the device: shard() made at first use, release() frees it
  bool reduce_scatter_ = false;  // stages 2-3
  int stage_ = 0;
  Communicator* all_reduce_comm_ = nullptr;
  // Stage 3: reduce-scatters on a process group of their own (FSDP's reduce-scatter stream), so the
  // backward's prefetch all-gathers do not queue behind them; stage 2 (and a communicator that cannot
  // form a second group): the step's communicator.
  std::unique_ptr<Communicator> rs_own_;
  std::unique_ptr<CommTracker> rs_own_tracker_;  // rs_own_'s works (destroyed first: declared after it)
  Communicator* rs_comm_ = nullptr;
  CommTracker* rs_tracker_ = nullptr;  // the tracker of rs_comm_
  torch::Tensor grad_all_;       // stages 0-1: full gradients
  torch::Tensor grad_shard_all_; // stages 2-3: this rank's gradient shard
  torch::Tensor host_scratch_;   // offload.grads: one unit's reduced shard on its way to the host
  std::vector<torch::Tensor> grad_full_;  // stages 2-3: per unit, this microbatch's full gradient
  std::vector<Bucket> buckets_;
  std::vector<RsBucket> rs_buckets_;
  std::vector<int> rs_bucket_of_;  // per unit, -1 without parameters
  std::vector<int> rs_slot_of_;    // per unit: its index in its bucket's units
  torch::Tensor bucket_buffer_;    // the open bucket of several units, rank-major: [world, its shards]
  std::deque<PendingReduce> pending_;
  std::vector<CommTracker::Handle> reduces_;
  std::deque<CastBucket> cast_buckets_;  // at most one in flight (one cast buffer at a time)
};

// Activation offload for one microbatch's units (activation_offload.cpp): the saved tensors the policy
// picks go to the host on the side lane and come back before their unit's backward.
class ActivationOffload final : public saved_tensors::Handler {
 public:
  struct Entry;
  struct Slot;
  explicit ActivationOffload(Ctx& c);
  ~ActivationOffload() override;
  bool on() const { return ratio_ > 0; }
  // Unit u's forward runs while the returned scope lives (nothing when off or checkpointed); then
  // end_forward, for every unit.
  std::optional<saved_tensors::Scope> capture(int u, bool checkpointed);
  // The same without the scope, for a driver that routes the saved tensors itself (the hook driver: from
  // Python's saved_tensors_hooks to hooks()): true when unit u's saved tensors are to be captured now.
  bool begin_capture(int u, bool checkpointed);
  void end_forward(int u, const torch::Tensor& in, const torch::Tensor& out);
  void before_bwd(int u);  // u's tensors back on the device; earlier units prefetched within the budget
  void after_bwd(int u);
  std::vector<OffloadedActivations> summary() const;  // per unit, the last microbatch's picks

  std::unique_ptr<torch::autograd::SavedVariableHooks> hooks() override;
  torch::Tensor unpack(Slot& slot);

 private:
  struct UnitState {
    std::vector<std::shared_ptr<Slot>> slots;     // saved in the forward, until end_forward
    std::vector<std::shared_ptr<Entry>> entries;  // sent to the host, until restored
    int tensors = 0, offloaded = 0;
    std::int64_t bytes = 0, offloaded_bytes = 0;
    bool let_go = false;
    bool captured = false;  // its forward ran inside capture(), end_forward not yet
  };
  void let_go(int u);
  void copy_back(int u);
  Ctx& c_;
  double ratio_;
  OffloadPolicy policy_{0};
  int capturing_ = 0;
  std::vector<UnitState> units_;
  std::vector<int> points_;  // prefetch_points for this microbatch's backward
  std::uint64_t last_ticket_ = 0;
};

class Activations {
 public:
  explicit Activations(Ctx& c);
  // Runs unit u's forward on x (detached into a leaf that needs grad unless it is the model's input);
  // keeps what its backward needs. Returns the output (attached to the unit's graph unless checkpointed).
  torch::Tensor forward(int u, const torch::Tensor& x, int micro);
  // The unit's output with its graph, recomputed for a checkpointed unit; and the input to differentiate.
  torch::Tensor output_for_backward(int u, int micro);
  const torch::Tensor& input(int u) const { return state_[static_cast<std::size_t>(u)].in; }
  void after_bwd(int u);  // drops the unit's activations (restores buffers a recompute changed)

 private:
  struct State {
    torch::Tensor in, out;
    Recompute recompute;
    // checkpoint_offload: the kept input on the host between the forward and the recompute.
    torch::Tensor in_host;
    std::vector<std::int64_t> in_shape;
    bool in_grad = false;
  };
  Ctx& c_;
  std::vector<State> state_;
  ActivationOffload offload_;

 public:
  const ActivationOffload& offload() const { return offload_; }
};

class Precision {
 public:
  explicit Precision(Ctx& c);
  double loss_scale() const { return scaler_.scale(); }  // multiplies the loss gradient this step
  // This rank's final gradients, as the optimizer reads them, unscaled in place; true when some rank saw
  // an inf/NaN (dynamic scaling): every rank then skips the step.
  bool unscale_and_check(const std::vector<torch::Tensor>& grads);
  // The same check on gradients that keep their scale (16-bit, read chunk by chunk into fp32 by the
  // master's step); unscale_factor(): what such a chunk is multiplied by (undefined: no loss scaling).
  bool check(const std::vector<torch::Tensor>& grads);
  torch::Tensor unscale_factor() const { return scaler_.enabled() ? scaler_.inv_scale() : torch::Tensor(); }
  void after_step(bool skipped) { scaler_.update(skipped); }
  LossScaler& scaler() { return scaler_; }

 private:
  Ctx& c_;
  LossScaler scaler_;
};

class OptimizerStep {
 public:
  OptimizerStep(Ctx& c, ParamResidency& params, GradSync& grads, Precision& precision);
  // Steps this rank's shard with the learning rate x lr_scale and brings the updated parameters to where
  // the units compute; false when the step was skipped (non-finite gradients): parameters and optimizer
  // state untouched.
  bool step(double lr_scale = 1.0);
  std::int64_t stepped_numel() const { return stepped_; }
  // Checkpoints (checkpoint.cpp): the master shard (undefined without one) and the optimizer.
  torch::Tensor& master() { return master_; }
  FlatOptimizer& optimizer() { return *optimizer_; }

 private:
  bool step_master_by_unit(double lr_scale);  // 16-bit gradients into the fp32 master, one unit at a time
  void sync_params();  // stages 1-2: every rank's updated chunks all-gathered into the full parameters
  void master_to_params();  // the updated master rounded into the compute copy (stages 0 and 3)
  Ctx& c_;
  ParamResidency& params_;
  GradSync& grads_;
  Precision& precision_;
  int stage_ = 0;
  bool separate_master_ = false;  // a master shard apart from the parameters: fp32 beside 16-bit
                                  // params, or offload.optimizer with parameters on the device
  std::int64_t stepped_ = 0;
  torch::Tensor master_;          // the master shard, on the host with offload.optimizer
  torch::Tensor host_grad_;       // offload.optimizer: host copy of the gradient shard for the step
  std::unique_ptr<FlatOptimizer> optimizer_;
  std::vector<std::vector<int>> gather_buckets_;  // stages 1-2: units per all-gather (allgather_buckets)
};

class ReplicaSync {
 public:
  ReplicaSync(Ctx& c, ParamResidency& params, GradSync& grads);
  // Before step `step`'s first microbatch: tells GradSync which ranks all-reduce gradients.
  void begin_step(std::int64_t step);
  int grad_ranks() const { return grad_ranks_; }  // ranks whose gradients are summed this step
  void after_step(std::int64_t step);             // parameters averaged, slow update, when due

 private:
  Ctx& c_;
  ParamResidency& params_;
  GradSync& grads_;
  std::unique_ptr<Communicator> node_;  // this node's ranks, when 1 < ranks_per_node < world
  int grad_ranks_ = 1;
  torch::Tensor slow_momentum_, old_params_;  // SlowMo, full size on every rank
};

// fairscale AdaScale (SGD): per rank the squared norms of each microbatch's gradient, one small
// all-reduce with the final gradient's squared norm; the gain from AdaScaleGain (optimizer.h).
class AdaScale {
 public:
  explicit AdaScale(Ctx& c);
  void begin_step();
  // A unit's gradient of parameter slot `offset` from this microbatch's backward (`g` as autograd
  // returned it); tied weights: a borrower's part waits for the owner's (the norm is of their sum).
  void own(int u, std::int64_t offset, const torch::Tensor& g);
  void borrowed(int owner, std::int64_t offset, const torch::Tensor& g);
  // After the gradients are final: updates the averages, returns the gain for this step (1 when there is
  // a single gradient sample: one rank, one microbatch).
  double finish(GradSync& grads);

 private:
  Ctx& c_;
  AdaScaleGain gain_;
  torch::Tensor local_sqr_;  // this step, fp64
  std::map<std::pair<int, std::int64_t>, torch::Tensor> tied_;
};

// Differentiates unit u's output `out` (with its graph) from its input leaf `in` with the incoming
// gradient: the gradients of its parameters (and of the weights it borrows) accumulate into
// region(owner), AdaScale (when given) seeing each; returns the gradient of its input (undefined for the
// model's input).
torch::Tensor differentiate(Ctx& c, int u, torch::Tensor out, const torch::Tensor& in, const torch::Tensor& grad,
                            const std::function<torch::Tensor(int)>& region, AdaScale* adascale);
// The loss of one microbatch from the last unit's output, its gradient scaled by `scale`: the loss in
// fp32 (autocast's rule for losses) from the logits in their compute dtype; the gradient comes back in
// that dtype, the fp32 copy and its gradient freed with the loss (as the profiler measures the last unit).
torch::Tensor loss_grad(Ctx& c, torch::Tensor last, const torch::Tensor& target, int micro, double scale,
                        double& loss_sum);
// The model's input on the device; floating inputs (images) in the compute dtype, as the profiler feeds
// them (16-bit weights compute on 16-bit inputs; token ids stay integers).
torch::Tensor model_input(const Ctx& c, torch::Tensor t);

class Checkpoint {
 public:
  Checkpoint(Ctx& c, ParamResidency& params, OptimizerStep& opt, Precision& precision);
  // Collective: every rank writes its shard of the states after `step` steps into dir/step-<step>/, then
  // rank 0 the manifest (a checkpoint exists exactly when its manifest does).
  void save(const std::string& dir, std::int64_t step);
  // This rank's states from dir's newest checkpoint, resharded for this run's ranks and zero stage;
  // returns its step. Throws ExecError naming what does not match (units, dtype, optimizer).
  std::int64_t load(const std::string& dir);

 private:
  int shards() const;  // chunks per unit in this run's layout: the ranks at stages 1-3, else 1
  torch::Tensor owned_params();
  Ctx& c_;
  ParamResidency& params_;
  OptimizerStep& opt_;
  Precision& precision_;
};

// fairscale OffloadModel (zero stage 0): parameters, gradients and optimizer state live on the host
// (ParamResidency::flat(), GradSync::full(), OptimizerStep). Slices of consecutive units, balanced by
// parameter count (offload_model_slice_starts, as the simulator), are loaded to the device for their
// forward and again for their backward; a unit that lends weights to a later one (tied weights) is loaded
// with its borrower's slice too, as fairscale moves a shared parameter with whichever shard holds it.
// Gradients: a unit's device gradient exists from its first backward use in the microbatch (its own
// slice, or a borrower's) until its own slice's backward ends; it starts from zeros in the first
// accumulation microbatch and from the host's copy after that (fairscale moves .grad with the shard),
// is all-reduced on the last one (no_sync before it) and copied home.
class OffloadModel {
 public:
  // adascale: when the plan runs AdaScale (it sees every parameter gradient), else nullptr.
  OffloadModel(Ctx& c, ParamResidency& params, GradSync& grads, AdaScale* adascale);
  // One accumulation microbatch `j` of step `step` (sim/src/lowering/offload_model.cpp): forward and
  // backward over the slices, the loss (the chunks' losses added to loss_sum, the gradient scaled by
  // `scale`), the gradients home.
  void microbatch(std::int64_t step, int j, double scale, double& loss_sum);

 private:
  int slices() const { return static_cast<int>(starts_.size()) - 1; }
  int first(int s) const { return starts_[static_cast<std::size_t>(s)]; }
  int end(int s) const { return starts_[static_cast<std::size_t>(s) + 1]; }
  // Slice s's parameters (and those its units borrow) on the device; for the backward (micro: the outer
  // accumulation microbatch) their gradients too.
  void load_forward(int s, int micro);
  void load_backward(int s, int micro);
  void drop_forward(int s);
  // After slice s's backward: the gradients of its units all-reduced (last microbatch, several ranks),
  // copied to the host and freed with the slice's parameters.
  void finish_backward(int s, int micro, bool last_micro);
  // Where unit u's gradient accumulates (on the device while its slice or a borrower's is loaded).
  torch::Tensor region(int u);
  torch::Tensor unit_forward(int u, const torch::Tensor& x, int micro, bool recompute, torch::Tensor* in_leaf);
  // The slice's units and the owners its units borrow from (offload_model_slice_members).
  const std::vector<int>& members(int s) const { return members_[static_cast<std::size_t>(s)]; }
  void load_params(int u, int micro);
  void drop_params(int u);
  Ctx& c_;
  ParamResidency& params_;
  GradSync& grads_;
  AdaScale* adascale_ = nullptr;
  std::vector<int> starts_;
  std::vector<std::vector<int>> members_;
  std::vector<char> loaded_;
  std::vector<torch::Tensor> grad_;  // per unit: its device gradient while it exists
  int micro_ = 0;                    // the outer microbatch of the backward under way
};

// Pipeline parallelism (fairscale Pipe / GPipe, and 1F1B), the simulator's sim/src/lowering/pipeline.cpp.
// Ranks are stage-major, as the simulator assumes: rank = stage x dp + replica, so a stage's data-parallel
// group is dp consecutive ranks (Communicator::split(dp)) and replica d's pipeline is ranks d, dp + d, ...
// Activations go forward and their gradients back point to point on the world communicator (Gloo send /
// recv between the same replica's ranks of neighbouring stages); a header with the shape and dtype goes
// before each activation.
class Pipeline {
 public:
  // Balance: the plan's units per stage (pipeline_balance's list); time/memory balances need the model's
  // profile, which `zeroplan run` resolves into a list before the executor starts.
  Pipeline(const Plan& plan, int model_units, Communicator& world);
  Communicator& dp() { return *dp_; }  // this stage's data-parallel group
  StageUnits units() const;
  int stage() const { return stage_; }
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ + 1 == stages_; }
  const std::vector<PipelineOp>& order() const { return order_; }
  bool checkpointed(int mb) const { return pipeline_checkpointed(plan_, mb); }
  void attach(Ctx& c, const zoo::Model& model);  // the tied weights this stage shares with another

  torch::Tensor recv_input(int mb);                      // from the previous stage
  void send_output(int mb, const torch::Tensor& y);      // to the next stage
  torch::Tensor recv_grad(int mb);                       // the gradient of what send_output sent
  void send_grad(int mb, const torch::Tensor& g);        // the gradient of what recv_input returned
  // Tied weights: a borrower's replica gradient goes to its owner (and is zeroed here); the owner adds it
  // to its own before the unit's gradient is reduced (stages 0-1: once, on the last microbatch).
  void tied_grads_out(int u, GradSync& grads, bool last_micro);
  void tied_grads_in(int u, GradSync& grads, bool last_micro);
  void tied_params_after_step(ParamResidency& params);   // the owner's updated weights to the replicas
  double share_loss(double loss);                        // the last stage's loss, on every stage
  void finish_step();                                    // every send waited

 private:
  int tag(int kind, int mb, int k = 0) const { return kind * 1000000 + mb * 64 + k; }
  int peer(int stage) const { return stage * dp_size_ + replica_; }
  int stage_of(int unit) const;
  bool tied_due(bool last_micro) const;
  void waited(const char* what, double t0_s, int mb = -1);
  struct Tie {
    int local_unit = 0;       // this stage's unit: the owner's or the borrower's
    std::int64_t offset = 0;  // of the weight in that unit's flat parameter
    std::int64_t numel = 0;
    int other_stage = 0;
    int k = 0;                // the tie's index (tags)
    bool owner = false;
  };
  const Plan plan_;
  Communicator& world_;
  std::unique_ptr<Communicator> dp_own_;
  Communicator* dp_ = nullptr;
  int stages_ = 1, stage_ = 0, dp_size_ = 1, replica_ = 0;
  std::vector<int> balance_, first_;
  std::vector<PipelineOp> order_;
  Ctx* c_ = nullptr;
  std::vector<Tie> ties_;
  std::vector<std::vector<std::int64_t>> sent_shape_;  // per microbatch: the output's shape
  std::vector<torch::ScalarType> sent_dtype_;
  std::vector<std::unique_ptr<Work>> act_sends_;         // per microbatch: waited once its gradient came back
  std::unique_ptr<Work> grad_send_;                      // one in flight
  torch::Tensor grad_sent_;
  std::unique_ptr<Work> tied_send_;                      // one in flight
  torch::Tensor tied_sent_;
  std::vector<std::unique_ptr<Work>> other_sends_;       // waited at the end of the step
  std::vector<torch::Tensor> other_sent_;
};

}  // namespace zeroplan::exec::pieces
