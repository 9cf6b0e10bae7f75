// The executor's pieces (pieces.h lists them): GradSync (dp_sync.cpp).
#pragma once

#include "context.h"

namespace zeroplan::exec::pieces {

class GradSync {
 public:
  explicit GradSync(Ctx& c);
  void zero();                                  // before the step's first microbatch
  torch::Tensor region(int owner);              // where unit owner's gradient accumulates this microbatch
  void after_bwd(int u, int micro, bool last_micro);  // launches the unit's (or its bucket's) collective
  // Stages 2-3: this microbatch's reductions in the shard, all but the newest `keep` (the last microbatch's
  // last reduce-scatter stays in flight while the optimizer steps the rest: finish_step waits it).
  void finish_microbatch(std::size_t keep = 0);
  // The units whose reduce-scatters are still in flight (their gradients not final until finish_step).
  std::vector<int> units_in_flight() const;
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
  // With a transient shard: whether each unit's part of it holds this step's gradient yet. The shard is
  // made without a zero fill (162 MB took 18 ms at a GPT's first landing); a unit's first reduce-scatter
  // of the step is copied in, the next microbatches' are added.
  std::vector<char> shard_written_;
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

}  // namespace zeroplan::exec::pieces
