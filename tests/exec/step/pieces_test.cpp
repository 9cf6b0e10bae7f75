// The executor's pieces on their own (pieces_rig.h): ParamResidency, GradSync, OptimizerStep and
// ReplicaSync, their collectives and what they keep resident. pieces_compute_test.cpp: the pieces around
// autograd; pieces_stage_test.cpp: Pipeline and Checkpoint.
#include "pieces_rig.h"

namespace zeroplan::exec {
namespace {

using piece_rig::Rig;
using piece_rig::total;

std::int64_t padded_bytes(const pieces::UnitRT& U) { return U.layout.padded_numel() * 4; }
// Whether unit u's full (gathered) buffer holds memory now: the piece frees a released unit's storage.
bool resident(const pieces::Ctx& c, int u) { return c.unit(u).full.storage().nbytes() > 0; }

// Stage 3 (FSDP): only this rank's shards stay resident; a unit's forward gathers it (one all-gather of
// its padded size) and prefetches the next one; resharding after forward frees it unless it is pinned
// (unit 0, FSDP's root); the backward gathers again and prefetches the unit before it.
TEST(ParamResidencyPiece, Stage3GathersPrefetchesAndReshardsUnitByUnit) {
  Rig rig(3);
  pieces::ParamResidency params(*rig.c);
  pieces::Ctx& c = *rig.c;
  ASSERT_EQ(c.unit_count(), 4);
  for (int u = 0; u < 4; ++u) EXPECT_FALSE(resident(c, u)) << "unit " << u << ": only the shards are resident";
  EXPECT_EQ(params.flat().numel(), c.shard_total);
  EXPECT_TRUE(c.unit(0).pinned);

  params.before_fwd(0, 0);  // unit 0, and unit 1 prefetched
  std::vector<CollectiveCall> calls = rig.calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].kind, Collective::kAllGather);
  EXPECT_EQ(calls[0].bytes, padded_bytes(c.unit(0)));
  EXPECT_EQ(calls[1].bytes, padded_bytes(c.unit(1)));
  // The gathered unit: every chunk this rank's shard (the mirror's peers hold the same).
  const pieces::UnitRT& u0 = c.unit(0);
  EXPECT_TRUE(torch::equal(u0.full.narrow(0, 0, u0.shard()), params.chunk(0)));
  EXPECT_TRUE(torch::equal(u0.full.narrow(0, 3 * u0.shard(), u0.shard()), params.chunk(0)));

  params.after_fwd(0);  // pinned: stays
  EXPECT_TRUE(resident(c, 0));
  params.before_fwd(1, 0);  // already in flight: only unit 2 is gathered now
  EXPECT_EQ(rig.calls().size(), 3u);
  EXPECT_TRUE(resident(c, 1));
  params.after_fwd(1);
  EXPECT_FALSE(resident(c, 1)) << "unit 1 resharded after its forward";
  EXPECT_TRUE(resident(c, 2)) << "prefetched, not yet used";

  rig.comm.reset();
  params.before_bwd(1, 0);  // gathered again for the backward, unit 0 (pinned, resident) not gathered
  calls = rig.calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].bytes, padded_bytes(c.unit(1)));
  params.after_bwd(1);
  EXPECT_FALSE(resident(c, 1)) << "released after its backward";
}

// Without resharding (FSDP's SHARD_GRAD_OP) a unit stays gathered from its forward to its backward, and the
// backward gathers nothing; without prefetch only the unit asked for is gathered.
TEST(ParamResidencyPiece, Stage3WithoutReshardOrPrefetch) {
  Rig rig(3, /*reshard=*/false, /*prefetch=*/false);
  pieces::ParamResidency params(*rig.c);
  params.before_fwd(1, 0);
  EXPECT_EQ(rig.calls().size(), 1u) << "no prefetch";
  EXPECT_FALSE(resident(*rig.c, 2));
  params.after_fwd(1);
  EXPECT_TRUE(resident(*rig.c, 1)) << "kept to its backward";
  rig.comm.reset();
  params.before_bwd(1, 0);
  EXPECT_TRUE(rig.calls().empty());
}

// buckets.prefetch_depth 2: a unit's forward gathers the next two (FSDP2's explicit prefetching), its backward
// the two before it; a gather already in flight is not issued again, so each unit is gathered once per pass.
TEST(ParamResidencyPiece, PrefetchDepthGathersThatManyUnitsAhead) {
  Rig rig([](Plan& p) {
    p.zero_stage = 3;
    p.reshard_after_forward = true;
    p.buckets.prefetch_depth = 2;
  });
  pieces::ParamResidency params(*rig.c);
  pieces::Ctx& c = *rig.c;
  params.before_fwd(0, 0);  // unit 0, and units 1 and 2 prefetched
  std::vector<CollectiveCall> calls = rig.calls();
  ASSERT_EQ(calls.size(), 3u);
  for (int u = 0; u < 3; ++u) EXPECT_EQ(calls[static_cast<std::size_t>(u)].bytes, padded_bytes(c.unit(u))) << "unit " << u;
  EXPECT_FALSE(resident(c, 3)) << "three ahead is beyond the depth";
  params.after_fwd(0);
  params.before_fwd(1, 0);  // only unit 3 is new
  EXPECT_EQ(rig.calls().size(), 4u);
  EXPECT_TRUE(resident(c, 3));
  for (int u = 1; u < 4; ++u) {
    if (u > 1) params.before_fwd(u, 0);
    params.after_fwd(u);
  }
  EXPECT_EQ(rig.calls().size(), 4u) << "each unit gathered once in the forward";
  rig.comm.reset();
  params.before_bwd(3, 0);  // units 3, 2 and 1 (unit 0 is pinned, still gathered)
  EXPECT_EQ(rig.calls().size(), 3u);
  EXPECT_TRUE(resident(c, 1));
}

// Stages 0-2: every unit resident in one full buffer; the piece gathers nothing, ever.
TEST(ParamResidencyPiece, Stages0To2KeepEveryUnitAndGatherNothing) {
  for (const int stage : {0, 1, 2}) {
    Rig rig(stage);
    pieces::ParamResidency params(*rig.c);
    EXPECT_EQ(params.flat().numel(), rig.c->padded_total) << "stage " << stage;
    for (int u = 0; u < rig.c->unit_count(); ++u) EXPECT_TRUE(resident(*rig.c, u)) << "stage " << stage << " unit " << u;
    for (int u = 0; u < rig.c->unit_count(); ++u) {
      params.before_fwd(u, 0);
      params.after_fwd(u);
    }
    for (int u = rig.c->unit_count() - 1; u >= 0; --u) {
      params.before_bwd(u, 0);
      params.after_bwd(u);
    }
    EXPECT_TRUE(rig.calls().empty()) << "stage " << stage;
  }
}

// One microbatch's backward by hand: every unit's gradient region filled with ones, last unit first.
void backward(pieces::GradSync& grads, const pieces::Ctx& c, int micro, bool last) {
  for (int u = c.unit_count() - 1; u >= 0; --u) {
    grads.region(u).fill_(1.0);
    grads.after_bwd(u, micro, last);
  }
  grads.finish_microbatch();
}

// Stage 2 (DeepSpeed's reduce_bucket_size): units grouped in backward order until reduce_buffer_elems, one
// reduce-scatter per group, every microbatch; all of them together move every unit's padded gradient once.
// Stage 3 reduce-scatters unit by unit, whatever the bucket size.
TEST(GradSyncPiece, ReduceScattersByBucketEveryMicrobatch) {
  struct Case {
    int stage;
    std::int64_t bucket;
    int expected;  // reduce-scatters per microbatch (units with parameters: 4)
  };
  for (const Case& k : {Case{2, 1, 4}, Case{2, 1000000000, 1}, Case{3, 1000000000, 4}}) {
    Rig rig(k.stage, true, true, k.bucket);
    pieces::GradSync grads(*rig.c);
    grads.zero();
    for (int micro = 0; micro < 2; ++micro) backward(grads, *rig.c, micro, micro == 1);
    grads.finish_step();
    int count = 0;
    const std::int64_t bytes = total(rig.calls(), Collective::kReduceScatter, &count);
    EXPECT_EQ(count, 2 * k.expected) << "stage " << k.stage << " bucket " << k.bucket;
    EXPECT_EQ(bytes, 2 * rig.c->padded_total * 4) << "stage " << k.stage << " bucket " << k.bucket;
    EXPECT_EQ(total(rig.calls(), Collective::kAllReduce, &count), 0);
    EXPECT_EQ(grads.shard().numel(), rig.c->shard_total);
  }
}

// Stages 0-1 (DDP): nothing is reduced before the last microbatch (no_sync); then buckets of
// all_reduce_bucket_bytes in reverse unit order are all-reduced, together the whole padded gradient once.
TEST(GradSyncPiece, AllReducesBucketsOnTheLastMicrobatchOnly) {
  for (const std::int64_t bucket : {std::int64_t{1}, std::int64_t{1000000000}}) {
    Rig rig(0, true, true, bucket);
    pieces::GradSync grads(*rig.c);
    grads.set_all_reduce_comm(&rig.comm);
    grads.zero();
    backward(grads, *rig.c, 0, false);
    EXPECT_TRUE(rig.calls().empty()) << "a microbatch before the last reduces nothing";
    backward(grads, *rig.c, 1, true);
    grads.finish_step();
    int count = 0;
    const std::int64_t bytes = total(rig.calls(), Collective::kAllReduce, &count);
    EXPECT_EQ(count, grads.buckets()) << "bucket " << bucket;
    EXPECT_EQ(bucket == 1 ? 4 : 1, grads.buckets()) << "bucket " << bucket;
    EXPECT_EQ(bytes, rig.c->padded_total * 4) << "bucket " << bucket;
  }
}

// The optimizer step at each stage: stages 1-2 step this rank's chunk and all-gather the updated
// parameters (every unit's padded size once); stages 0 and 3 need no collective (stage 0 steps the whole
// model, stage 3 only its shard, gathered at the next forward).
TEST(OptimizerStepPiece, StagesOneAndTwoGatherTheUpdatedParameters) {
  for (const int stage : {0, 1, 2, 3}) {
    Rig rig(stage);
    pieces::ParamResidency params(*rig.c);
    pieces::GradSync grads(*rig.c);
    pieces::Precision precision(*rig.c);
    pieces::OptimizerStep opt(*rig.c, params, grads, precision);
    grads.set_all_reduce_comm(&rig.comm);
    grads.zero();
    backward(grads, *rig.c, 0, true);
    grads.finish_step();
    rig.comm.reset();
    EXPECT_TRUE(opt.step());
    int count = 0;
    const std::int64_t gathered = total(rig.calls(), Collective::kAllGather, &count);
    EXPECT_EQ(gathered, stage == 1 || stage == 2 ? rig.c->padded_total * 4 : 0) << "stage " << stage;
    EXPECT_EQ(opt.stepped_numel(), stage == 0 ? rig.c->padded_total : rig.c->shard_total) << "stage " << stage;
    if (stage == 3) grads.release();
  }
}

// LocalSGD with every rank its own node: no gradient is all-reduced; the parameters are averaged (one
// all-reduce of the whole model) every localsgd_frequency steps, and identical replicas stay identical.
TEST(ReplicaSyncPiece, LocalSgdAveragesParametersEveryFrequencySteps) {
  Rig rig(0, true, true, -1, /*localsgd=*/4);
  pieces::ParamResidency params(*rig.c);
  pieces::GradSync grads(*rig.c);
  pieces::ReplicaSync replicas(*rig.c, params, grads);
  const torch::Tensor before = params.flat().clone();
  int averaged = 0;
  for (std::int64_t step = 0; step < 8; ++step) {
    replicas.begin_step(step);
    EXPECT_EQ(replicas.grad_ranks(), 1) << "step " << step;
    rig.comm.reset();
    replicas.after_step(step);
    int count = 0;
    const std::int64_t bytes = total(rig.calls(), Collective::kAllReduce, &count);
    EXPECT_EQ(count, (step + 1) % 4 == 0 ? 1 : 0) << "step " << step;
    if (count > 0) {
      EXPECT_EQ(bytes, rig.c->padded_total * 4);
    }
    averaged += count;
  }
  EXPECT_EQ(averaged, 2);
  EXPECT_TRUE(torch::allclose(params.flat(), before));
}

}  // namespace
}  // namespace zeroplan::exec
