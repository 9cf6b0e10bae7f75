// Shared state of the lowering pieces: the inputs, the task graph being built, the resources and pools,
// the expanded units with their costs, and the byte sizes the precision settings imply.
#pragma once

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/sim/cost_models.h"
#include "zeroplan/sim/simulate.h"
#include "zeroplan/sim/task_graph.h"

namespace zeroplan::sim::lowering {

// One repetition of a profile unit, with its costs at the plan's micro batch.
struct Unit {
  int profile_index = 0;
  int rep = 0;
  std::int64_t params = 0;
  std::int64_t shard = 0;          // ceil(params / N): this rank's shard of the unit's flat parameter
  std::int64_t padded = 0;         // shard x N: the gathered flat parameter, padding included
  int tensors = 0;
  double fwd_s = 0;
  double recompute_s = 0;  // a recompute's forward: the last unit's without its loss, else fwd_s
  double bwd_s = 0;
  std::int64_t saved = 0;          // bytes saved for backward, one microbatch
  std::int64_t output = 0;         // output activation, one microbatch
  std::int64_t peak_fwd = 0;       // transient workspace
  std::int64_t peak_recompute = 0; // a recompute's peak: the last unit's without its loss, else peak_fwd
  std::int64_t peak_bwd = 0;
  // The unit's buffers (UnitProfile::bytes_buffer: BatchNorm's running statistics) in the parameters'
  // dtype, as the executor casts them: on its rank's device for the whole run, at every stage.
  std::int64_t buffer = 0;
  // Plan::grads_in_place and the profile has bytes_peak_bwd_in_place (not analytic or older ones): the
  // executor's backward adds the parameters' gradients into the flat gradient as autograd makes them
  // (pieces::differentiate), and peak_bwd is that figure.
  bool grads_in_place = false;
  bool checkpoint = false;
  // Activation offload: the profile's saved tensors the unit alone keeps (UnitProfile::saved_tensors, at
  // the reference batch, where the policy decides) and their scale to this plan's micro batch and dtype;
  // tensor_list false when the profile has none (analytic): a ratio of saved - input then goes.
  std::vector<std::int64_t> saved_tensors;
  double saved_tensor_scale = 1;
  bool tensor_list = false;
  // The backward's timeline (UnitProfile::bwd_unpack_order and the peaks of the backward this plan runs,
  // scaled as peak_bwd): empty when the profile has none.
  std::vector<std::int64_t> unpack_order, unpack_peaks;
  // Shared parameters (UnitProfile::borrowed), as expanded unit indices. An owner stays gathered from
  // its forward to its backward at stage 3, and its gradient starts at its first borrower's backward.
  bool pinned = false;
  std::vector<int> owners_due;     // borrower: owners whose gradient starts at this unit's backward
  // Every shared parameter this unit uses: (owner's expanded index, parameters borrowed).
  std::vector<std::pair<int, std::int64_t>> borrows;
  // Pipelines: parameters of shared weights whose owner runs on an earlier stage (this stage's replica,
  // included in params).
  std::int64_t replica_params = 0;
};

// Precision: bytes per element of each copy of the model states.
struct Bytes {
  int param = 4;    // compute copy of the parameters
  int grad = 4;     // gradients (param dtype)
  int reduce = 4;   // gradient collectives
  int master = 0;   // fp32 master copy when params are 16-bit and master_fp32 (counted as optimizer state)
  int states = 8;   // optimizer states: 4 x states_per_param (param dtype without master_fp32)
  int compute = 4;  // activations
};

Bytes bytes_of(const Plan& plan);

// Bytes from a figure's value, saturating at 1 PiB (2^50) instead of overflowing (context.cpp).
std::int64_t saturated_bytes(double v);

// The units after expanding repetitions, with sizes at the plan's micro batch; costs only if `cluster`.
std::vector<Unit> expand_units(const ModelProfile& model, const Plan& plan, const ClusterProfile* cluster);

// Activation offload where the profile lists no saved tensors (tensor_list false): the bytes of unit `x`
// that go to the host at `ratio`, a ratio of what it saves beside its input (`input`, kept anyway), as one
// tensor (Activations::pick_offloaded; the bounds count the same). Never falls as the ratio rises.
inline std::int64_t analytic_offloaded_bytes(const Unit& x, std::int64_t input, double ratio) {
  return static_cast<std::int64_t>(std::llround(static_cast<double>(std::max<std::int64_t>(0, x.saved - input)) * ratio));
}

// Model states resident for the whole step, per pool (what memory_bound and the lowering share).
struct Residency {
  // dev_grads: at stages 2-3 (not offloaded) the gradient shard exists only from the step's first
  // reduce-scatter landing to the optimizer step (GradSync allocates it); memory_bound counts it whole.
  std::int64_t dev_params = 0, dev_grads = 0, dev_optimizer = 0, dev_buffers = 0;
  std::int64_t dev_model_buffers = 0;  // the units' own buffers (Unit::buffer), never sharded
  bool dev_grads_transient = false;
  std::int64_t dev_slowmo = 0;  // SlowMo slow momentum + previous parameters (optimizer category)
  std::int64_t host_params = 0, host_grads = 0, host_optimizer = 0;
  std::int64_t host_buffers = 0;  // offloaded stage 2-3 gradients: the staging buffer of one unit's shard
  // host_optimizer as the executor allocates it: the master (or the host copy of the parameter shard),
  // then host_state_blocks blocks of host_state_block bytes, one per optimizer state.
  std::int64_t host_state_block = 0;
  int host_state_blocks = 0;
  std::int64_t host_master() const { return host_optimizer - host_state_block * host_state_blocks; }
  // The host's resident blocks, one per allocation (what a pinned caching allocator rounds one by one).
  std::vector<std::int64_t> host_blocks() const;
};
// Sums over units of the shard sizes; `units` already expanded.
Residency model_state_residency(const Plan& plan, const ClusterProfile& cluster, const std::vector<Unit>& units);

struct Ctx {
  Ctx(const ModelProfile& m, const ClusterProfile& c, const Plan& p, const SimOptions& o);
  // Pipeline stage `stage` (pipeline.cpp): a view of `whole`'s units [first, first + count) that builds
  // into `whole`'s graph with resources and pools of its own, named "s<stage>.<name>". Unit indices are
  // the stage's; labels and unit_name give the whole model's.
  Ctx(Ctx& whole, int stage, int first, int count);

  const ModelProfile& model;
  const ClusterProfile& cluster;
  const Plan& plan;
  const SimOptions& opt;
 private:
  std::unique_ptr<TaskGraph> own_graph_;  // null in a stage's view
 public:
  TaskGraph& g;
  int stage = -1;          // pipeline stage of this view, -1: the whole model on one rank
  int unit_offset = 0;     // the whole model's index of this view's unit 0
  std::string prefix;      // resource and pool names: "" or "s<stage>."

  int n = 1;           // data-parallel ranks
  int m = 1;           // microbatches
  Bytes b;
  std::vector<Unit> units;
  std::int64_t total_params = 0;
  // Unit 0's input, one microbatch (the model's input; a pipeline stage's: the previous stage's output):
  // kept when unit 0 is checkpointed (else in its saved bytes). The batch is fp32 images or int64 tokens.
  std::int64_t input0 = 0;
  // The RNG state a checkpointed unit keeps for its recompute: a CPU tensor (mt19937's state, 5056
  // bytes), in the device pool only when the device is the CPU.
  std::int64_t rng_state_bytes = 0;
  std::vector<std::string> notes;

  ResourceId compute = 0, h2d = 0, d2h = 0, comm = 0, comm_rs = 0, host_opt = 0;
  PoolId dev = 0, host = 0;

  // Names, interned once.
  NameId n_fwd, n_bwd, n_recompute, n_allgather, n_reduce_scatter, n_all_reduce, n_h2d, n_d2h, n_optimizer,
      n_saved, n_saved_offloaded, n_input_kept, n_workspace, n_gathered, n_full_grads, n_grad_acc, n_bucket, n_temp,
      n_rs_output, n_rs_wait, n_rs_add, n_params, n_grads, n_master, n_states, n_slowmo, n_reduce_buffers, n_loss_scale, n_param_sync,
      n_zero_grad, n_cast, n_gather_bucket,
      n_cat_compute, n_cat_comm, n_cat_copy, n_cat_optimizer, n_library, n_model_buffers;

  // Per-unit results of the current microbatch, filled by the step schedule.
  std::vector<TaskId> fwd, bwd;
  std::vector<TaskId> fwd0, bwd0;  // of the first microbatch, for the Prediction's unit timings
  TaskId last_compute = kNone;  // last task queued on the compute stream

  std::string unit_name(int u) const;
  Label label(NameId name, int u = -1, int mb = -1) const { return {name, u >= 0 ? u + unit_offset : u, mb}; }
  TaskId compute_task(double s, NameId name, int u, int mb);
  // collective_time(cluster, op, bytes, ranks, {algo, dtype}), each distinct question answered once per
  // lowering (the units of a model repeat a few sizes over every microbatch).
  double collective_s(CollOp op, double bytes, int ranks, CollAlgo algo, std::string_view dtype = "fp32");

 private:
  void intern_names();
  double compute_factor_ = 1;  // compute_time_factor(model, cluster)
  struct KnownCollective {
    CollOp op;
    CollAlgo algo;
    int ranks;
    double bytes;
    std::string dtype;
    double s;
  };
  std::vector<KnownCollective> known_collectives_;
  std::array<std::uint32_t, 16> recent_collectives_{};  // by a hash of (op, bytes, ranks): an index + 1 into known_
};

// The pieces, each in its own file.
void build_resources(Ctx& c);                                             // resources.cpp
// E[max of n independent standard normals] (0 for n <= 1): resources.cpp
double expected_max_of_normals(int n);
// The rank skew of the plan's collectives over `ranks` data-parallel ranks, from the profile's
// lock-step measurement (0 when it has none, or the cluster is not the device kind it was measured on).
double rank_skew_fraction(const ModelProfile& model, const ClusterProfile& cluster, int ranks);
void place_model_states(Ctx& c);                                          // model_states.cpp

// Stage 3 with reshard_after_forward: whether unit i stays gathered from its forward to its backward (unit 0,
// FSDP's root, and owners of shared weights, as the executor keeps them); the others are gathered again.
inline bool stays_gathered(const std::vector<Unit>& units, std::size_t i) { return i == 0 || units[i].pinned; }

// Parameter residency (stage 3 gather/free/prefetch, offloaded params): params_residency.cpp
struct ParamResidency {
  explicit ParamResidency(Ctx& c) : c_(c) {}
  TaskId before_fwd(int u, int mb);   // task the forward waits for (kNone: params resident)
  void after_fwd(int u, int mb, TaskId fwd);
  TaskId before_bwd(int u, int mb);
  void after_bwd(int u, int mb, TaskId bwd);
  TaskId last_gather = kNone;
 private:
  TaskId gather(int u, int mb, TaskId after);
  int back_distance() const;
  Ctx& c_;
  std::vector<TaskId> gathered_;  // per unit: gather task of the current phase
  std::vector<AllocId> gathered_alloc_;
  std::vector<double> h2d_s_, gather_s_;  // per unit: its shard's copy in, its all-gather (NaN: not yet asked)
  TaskId mb_start_ = kNone;  // the previous microbatch's last compute task, which its first gathers wait for
};

// Activation policy (keep, offload a ratio, checkpoint, checkpoint with the input offloaded): activations.cpp
// The bytes a unit's forward allocates beyond its saved activations (activations.cpp).
std::int64_t forward_workspace(const std::vector<Unit>& units, std::size_t i);
// What a recompute allocates beyond the unit's saved bytes: the forward workspace, except for the last
// unit profiled with its loss, whose recompute runs no loss: its peak without the loss less what it keeps
// (the saved bytes hold the loss's output gradient, as large as the output the recompute holds instead).
std::int64_t recompute_workspace(const std::vector<Unit>& units, std::size_t i);

struct Activations {
  explicit Activations(Ctx& c) : c_(c) {}
  void on_fwd(int u, int mb, TaskId fwd);
  TaskId before_bwd(int u, int mb, TaskId params_ready);  // H2D or recompute the backward waits for
  void after_bwd(int u, int mb, TaskId bwd);
  // A pipeline stage's recompute of a checkpointed microbatch, right before its backward, offloads no
  // activations (as the executor's); call before its first on_fwd.
  void keep_on_device() { keep_on_device_ = true; }
  // A pipeline stage: the compute task after which the microbatch's backward starts (its activations
  // come back from then on, not right after the forward), and the copy back of the stage's last unit,
  // which waits for the gradient received too (the pipeline's link adds that).
  void backward_starts_after(TaskId t) { backward_start_ = t; }
  TaskId last_unit_copy_back() const { return last_unit_h2d_; }
 private:
  TaskId backward_start_ = kNone;
  TaskId last_unit_h2d_ = kNone;
  bool keep_on_device_ = false;
  std::int64_t fwd_workspace(int u) const;
  std::int64_t incoming_grad(int u) const;
  void pick_offloaded();                     // activation_offload.h's policy over the units
  void set_windows();                        // activation_offload.h's windows of what pick_offloaded picked
  Ctx& c_;
  // Activation offload, per unit: the sizes of the tensors sent (bytes at this micro batch), their sum,
  // the most of them on the device at once in the forward and in the backward (activation_offload.h's
  // windows), the copy back.
  std::vector<std::vector<double>> off_sizes_;
  std::vector<std::vector<bool>> picked_;  // per unit, per saved tensor: offloaded (tensor lists only)
  std::vector<std::int64_t> off_bytes_, fwd_window_, bwd_window_;
  std::vector<TaskId> h2d_;
  TaskId last_fwd_ = kNone;  // this microbatch's forward of the last unit (after its copies out)
  TaskId prev_fwd_ = kNone;  // the previous unit's forward of this microbatch (its copies out run beside it)
  TaskId let_go_ = kNone;    // the previous unit's copies out done: the next forward waits for it
  std::vector<AllocId> pending_;     // per unit: kept activations (or checkpointed input), freed by the backward
  AllocId loss_ = kNone;             // the last unit's output, kept by the loss until that unit's backward
  std::vector<AllocId> offloaded_;   // per unit: activations copied back (or recomputed), freed by the backward
  std::vector<AllocId> host_part_;   // per unit: the host copy of the offloaded part (or checkpointed input)
  std::vector<TaskId> d2h_;          // per unit: the D2H of its offloaded part (or checkpointed input)
  std::vector<AllocId> rng_;         // per unit: a checkpointed unit's RNG state (CPU devices)
};

// Data-parallel gradient synchronisation per zero stage, buckets, microbatch semantics: dp_sync.cpp
struct GradDone {
  TaskId task = kNone;         // after it, these gradients are final on this rank (reduced, maybe on host)
  std::int64_t elems = 0;      // gradient elements this rank owns from it (its shard of the bucket/unit)
};
// Stages 2-3: units grouped in backward order until reduce_buffer_elems (stage 3: one unit each), as the
// executor groups them; `bucket_of` (optional) gets each unit's bucket index.
struct RsBucket {
  std::int64_t padded = 0, shard = 0;  // sums over the bucket's units with parameters
  int with_params = 0;                 // how many; one: reduce-scattered in place, no bucket copy
  int first = -1, last = -1;           // first and last unit with parameters, in backward order
};
std::vector<RsBucket> reduce_scatter_buckets(const Plan& plan, const std::vector<Unit>& units,
                                             std::vector<int>* bucket_of = nullptr);

// A reduce-scatter's buffers held until it is drained: its input, a cast copy, a temporary.
struct HeldAllocs {
  std::array<AllocId, 4> ids{};
  std::size_t n = 0;
  void push_back(AllocId a) {
    assert(n < ids.size());
    ids[n++] = a;
  }
  const AllocId* begin() const { return ids.data(); }
  const AllocId* end() const { return ids.data() + n; }
};

struct GradSync {
  explicit GradSync(Ctx& c);
  // Allocates gradients, launches bucket collectives; returns the unit's last compute task (the
  // gradient's accumulation after the backward at stages 2-3, else `bwd`).
  TaskId after_bwd(int u, int mb, TaskId bwd);
  // Flush a partial bucket, drain every reduce-scatter (the last microbatch's last one stays in flight
  // under Plan::steps_beside_last_reduce_scatter, until finish_step).
  void finish_microbatch(int mb);
  TaskId finish_step() { return drain(0, c_.m - 1); }  // the last drain's add (kNone: nothing in flight)
  // Stages 2-3: the microbatch's last reduce-scatter, which the next microbatch's forward waits for
  // (FSDP's end-of-backward callback, DeepSpeed's end-of-backward reduction); else kNone.
  TaskId microbatch_barrier() const { return c_.plan.zero_stage >= 2 && !reduces_.empty() ? reduces_.back() : kNone; }
  std::vector<GradDone> done;                // final gradients (last microbatch), in backward order
  // Stages 2-3 on the device: the gradient shard, allocated at the first reduce-scatter's wait (kNone
  // before, or where it lives all step); optimizer_step frees it after the step.
  AllocId shard_alloc() const { return shard_; }
 private:
  // A reduce-scatter in flight: its input, temporary and output live until it is drained on the
  // compute stream (the executor waits for it after issuing the next one, then adds its output).
  struct InFlight {
    TaskId rs = kNone;
    HeldAllocs allocs;            // freed at the wait
    AllocId output = kNone;       // freed once added into the gradient shard
  };
  void plan_buckets();
  TaskId reduce_scatter(std::int64_t padded, std::int64_t shard, int u, int mb, TaskId bwd, AllocId input);
  TaskId drain(std::size_t keep, int mb);  // returns the last wait task (kNone: none)
  void flush(int mb);
  Ctx& c_;
  std::int64_t bucket_elems_ = 0;
  TaskId bucket_last_ = kNone;
  std::vector<TaskId> reduces_;  // reduce-scatters issued, in order
  std::vector<InFlight> in_flight_;
  std::vector<RsBucket> rs_buckets_;
  std::vector<int> bucket_of_;   // per unit: its RsBucket
  AllocId bucket_buffer_ = kNone;
  std::vector<AllocId> early_;   // per owner: its gradient, allocated at its first borrower's backward
  std::vector<double> rs_s_;     // per unit: its reduce-scatter's time (NaN: not yet asked)
  std::int64_t shard_bytes_ = 0;  // a transient gradient shard's bytes (0: none)
  AllocId shard_ = kNone;
};

// The step's first compute task: the gradient buffers zeroed (kNone when there are none): dp_sync.cpp
TaskId zero_grads(Ctx& c);
// Optimizer step and the parameter sync after it (device or host, flat or per tensor): optimizer_step.cpp
void optimizer_step(Ctx& c, GradSync& grads);
// Stages 1-2: all-gather the updated shards (allgather_bucket_bytes buckets, fp16 when broadcast_fp16).
void param_sync(Ctx& c, const std::vector<TaskId>& after);
// The host optimizer's step over `elems` parameters after every task in `after`, as the executor runs it:
// with a 16-bit model beside an fp32 master, the fp32 copy of the gradients first (its buffer held for
// the step) and, with the parameters on the host, the master's rounding into them after. Returns the step.
TaskId host_step(Ctx& c, std::int64_t elems, const std::vector<TaskId>& after, bool params_on_host);
// Dynamic loss scale and AdaScale bookkeeping: precision.cpp
TaskId loss_scale_check(Ctx& c, const GradSync& grads);

// The step's schedule: microbatches x forward and backward over units.
void schedule_step(Ctx& c);                   // step.cpp
void schedule_offload_model(Ctx& c);          // offload_model.cpp

// Pipeline parallelism: stages as ranks of their own, GPipe or 1F1B over the microbatches: pipeline.cpp
struct PipelineStage {
  int first_unit = 0, units = 0;            // the whole model's expanded units
  ResourceId compute = 0;
  PoolId dev = 0, host = 0;
  std::vector<TaskId> work;                 // forward, backward and recompute tasks (the bubble's complement)
};
std::vector<PipelineStage> schedule_pipeline(Ctx& c);
// LocalSGD / SlowMo: extra seconds of a synchronising step, and how often one happens: localsgd.cpp
struct SyncAmortisation {
  double sync_extra_s = 0;       // what the step that averages (and does the slow update) adds
  double amortised_extra_s = 0;  // that spread over the steps between
};
SyncAmortisation localsgd_amortisation(const Ctx& c);
// The same from the plan and the whole model's expanded units (the tuner's step-time bound).
SyncAmortisation localsgd_amortisation(const Plan& plan, const ClusterProfile& cluster, const std::vector<Unit>& units);

}  // namespace zeroplan::sim::lowering
