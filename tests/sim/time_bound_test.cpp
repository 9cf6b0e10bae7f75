// step_time_lower_bound (the tuner's pruning) never exceeds the simulated step time, over grids of plans
// with and without pipeline stages; collective_time_lower_bound never exceeds the time of any split.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <string>

#include "fixtures.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/sim/cost_models.h"
#include "zeroplan/sim/memory_bound.h"
#include "zeroplan/sim/simulate.h"

namespace zeroplan::sim {
namespace {

using testing::a100;
using testing::cpu;
using testing::gpt;
using testing::mixed_plan;

// One node of 8 A100s whose all-gathers and reduce-scatters over 8 ranks have measured points that rise
// steeply past 2 MB (not concave): one collective of a total then costs more than the same bytes in small
// buckets, so the bound must not take it.
ClusterProfile a100_with_convex_fits(int nodes) {
  ClusterProfile c = a100(nodes);
  for (const char* op : {"all_gather", "reduce_scatter", "all_reduce"}) {
    CollectiveFit f;
    f.op = op;
    f.backend = "nccl";
    f.algorithm = "ring";
    f.scope = "intra_node";
    f.world_sizes = {8};
    f.alpha_s = 1e-5;
    f.beta_s_per_byte = 1e-11;
    f.points = {{1e5, 2e-5}, {2e6, 4e-5}, {4e6, 4e-3}, {8e6, 9e-3}};
    c.collectives.push_back(f);
  }
  return c;
}

// A CPU node whose probe measured core contention: compute and collectives slow each other.
ClusterProfile cpu_contended() {
  ClusterProfile c = cpu(4);
  c.core_contention.compute_with_comm_slowdown = 1.6;
  c.core_contention.comm_with_compute_slowdown = 2.5;
  return c;
}

// Plans without pipeline stages over `world` ranks: every zero stage, microbatches, checkpointing (and its
// offload), activation offload, offloaded model states, precisions, LocalSGD and SlowMo, small buckets,
// OffloadModel. Invalid combinations are skipped.
std::vector<Plan> flat_grid(int world) {
  std::vector<Plan> out;
  auto add = [&](const Plan& p) {
    try {
      validate(p);
      out.push_back(p);
    } catch (const SchemaError&) {
    }
  };
  for (int stage = 0; stage <= 3; ++stage) {
    for (const int microbatches : {1, 3}) {
      for (int variant = 0; variant < 10; ++variant) {
        Plan p = mixed_plan(world, stage, 2, microbatches);
        switch (variant) {
          case 0: break;
          case 1: p.checkpointing.mode = Checkpointing::Mode::all; break;
          case 2: p.checkpointing.mode = Checkpointing::Mode::all; p.checkpoint_offload = true; break;
          case 3: p.offload.activations_ratio = 0.5; break;
          case 4: p.offload.optimizer = true; p.offload.grads = stage >= 2; p.offload.params = stage == 3; break;
          case 5:  // fp32 everywhere
            p.precision.param_dtype = p.precision.compute_dtype = p.precision.reduce_dtype = "fp32";
            p.precision.master_fp32 = false;
            p.precision.loss_scale.mode = LossScale::Mode::none;
            break;
          case 6:
            p.precision.broadcast_fp16 = stage == 1 || stage == 2;
            p.precision.fp32_reduce_scatter = stage >= 2;
            if (stage >= 2) p.precision.reduce_dtype = "fp32";
            break;
          case 7:  // many small buckets
            p.buckets.all_reduce_bucket_bytes = 1 << 16;
            p.buckets.reduce_buffer_elems = 1 << 14;
            p.buckets.allgather_bucket_bytes = 1 << 16;
            p.reshard_after_forward = false;
            break;
          case 8:
            p.localsgd_frequency = 2;
            if (microbatches == 3) {
              p.slowmo_frequency = 2;
              p.slowmo_momentum = 0.5;
            }
            break;
          case 9:
            if (stage != 0) continue;
            p.offload_model = {true, 3, microbatches == 3, 2};
            break;
        }
        add(p);
      }
    }
  }
  return out;
}

void expect_bound_below_simulated(const ModelProfile& model, const ClusterProfile& cluster, const std::vector<Plan>& plans) {
  for (const Plan& p : plans) {
    SCOPED_TRACE(to_json_string(p));
    const double bound = step_time_lower_bound(model, cluster, p);
    const Prediction pred = simulate(model, cluster, p);
    EXPECT_GT(bound, 0);
    EXPECT_LE(bound, pred.step_time_s);
  }
}

TEST(StepTimeBound, FlatPlansNeverExceedTheSimulatedStep) {
  const ModelProfile model = gpt(4, 512, 8, 128, 2000);
  const ClusterProfile clusters[] = {a100(2), a100(1), a100_with_convex_fits(1), cpu(2), cpu_contended()};
  std::size_t plans = 0;
  for (const ClusterProfile& c : clusters) {
    SCOPED_TRACE(c.name + " x" + std::to_string(c.world_size()));
    const std::vector<Plan> grid = flat_grid(c.world_size());
    plans += grid.size();
    expect_bound_below_simulated(model, c, grid);
  }
  EXPECT_GT(plans, 300u);
}

// The bound is not vacuous: close to the step where compute dominates, and the collectives lift it where
// they do (stage 3 of a wide model at a short sequence across two nodes: 35 ms of gathers, 13 of compute).
TEST(StepTimeBound, FlatBoundFollowsTheBusiestStream) {
  const ModelProfile big = gpt(4, 1024, 16, 512, 2000);
  const Plan dense = mixed_plan(8, 0, 8, 2);
  EXPECT_GE(step_time_lower_bound(big, a100(1), dense), 0.8 * simulate(big, a100(1), dense).step_time_s);
  const ModelProfile small = gpt(4, 4096, 32, 32, 2000);
  const Plan stage3 = mixed_plan(16, 3, 1, 2);
  const double with_comm = step_time_lower_bound(small, a100(2), stage3);
  Plan one_rank = stage3;
  one_rank.world_size = 1;
  one_rank.global_batch = 2;
  one_rank.zero_stage = 0;
  one_rank.reshard_after_forward = false;
  const double compute_only = step_time_lower_bound(small, a100(2), one_rank);
  EXPECT_GT(with_comm, 4 * compute_only);
  const double step = simulate(small, a100(2), stage3).step_time_s;
  EXPECT_LE(with_comm, step);
  EXPECT_GE(with_comm, 0.7 * step);
}

TEST(StepTimeBound, PipelinedPlansNeverExceedTheSimulatedStep) {
  const ModelProfile model = gpt(6, 512, 8, 128, 2000);
  const ClusterProfile c = a100(2);
  std::vector<Plan> grid;
  for (const int stages : {2, 4}) {
    for (int stage = 0; stage <= 2; ++stage) {
      for (const char* schedule : {"gpipe", "1f1b"}) {
        for (const char* pipe_ckpt : {"never", "except_last", "always"}) {
          if (std::string(schedule) == "1f1b" && std::string(pipe_ckpt) != "never") continue;
          for (int variant = 0; variant < 4; ++variant) {  // none; units checkpointed; activation offload; LocalSGD
            Plan p = mixed_plan(16, stage, 1, 2 * stages);
            p.pipeline_stages = stages;
            p.global_batch = 2 * stages * 16 / stages;
            p.pipeline.schedule = schedule;
            p.pipeline.checkpoint = pipe_ckpt;
            p.checkpointing.mode = variant == 1 ? Checkpointing::Mode::all : Checkpointing::Mode::none;
            p.offload.activations_ratio = variant == 2 ? 0.5 : 0;
            if (variant == 3) p.localsgd_frequency = 4;
            try {
              validate(p);
            } catch (const SchemaError&) {
              continue;
            }
            grid.push_back(p);
          }
        }
      }
    }
  }
  EXPECT_GE(grid.size(), 60u);
  expect_bound_below_simulated(model, c, grid);
  // No recompute: the replay is most of the step (the rest: sends, gradient reductions, the optimizer).
  Plan p = mixed_plan(16, 0, 1, 8);
  p.pipeline_stages = 2;
  p.global_batch = 8 * 16 / 2;
  EXPECT_GE(step_time_lower_bound(model, c, p), 0.7 * simulate(model, c, p).step_time_s);
}

TEST(StepTimeBound, CheckpointingMoreUnitsOnlyRaisesIt) {
  const ModelProfile model = gpt(4, 512, 8, 128, 2000);
  for (const int stages : {1, 2}) {
    Plan p = mixed_plan(16, 1, 1, 4);
    p.pipeline_stages = stages;
    p.global_batch = 4 * 16 / stages;
    const double none = step_time_lower_bound(model, a100(2), p);
    p.checkpointing = {Checkpointing::Mode::units, {1, 2}};
    const double some = step_time_lower_bound(model, a100(2), p);
    p.checkpointing.mode = Checkpointing::Mode::all;
    p.checkpointing.units.clear();
    const double all = step_time_lower_bound(model, a100(2), p);
    p.checkpoint_offload = true;
    p.offload.activations_ratio = 0.3;
    EXPECT_EQ(step_time_lower_bound(model, a100(2), p), all);  // every unit checkpointed: nothing offloaded, copies in not counted
    EXPECT_LT(none, some);
    EXPECT_LE(some, all);
  }
}

// A pipeline stage's activation-offload copies stand between its compute tasks: the step-time bound counts
// them and the memory bound the share each unit keeps, so as the ratio rises the first never falls and the
// second never rises (what the tuner's search assumes), each still below the simulated step and peak.
TEST(StepTimeBound, PipelinedActivationOffloadRaisesTheTimeBoundAndLowersTheMemoryBound) {
  const ModelProfile model = gpt(6, 1024, 16, 512, 1000);
  const ClusterProfile c = a100(2);
  int plans = 0;
  for (const int stages : {2, 4, 8}) {
    for (const int stage : {0, 1, 2}) {
      for (const char* schedule : {"gpipe", "1f1b"}) {
        for (const bool some_checkpointed : {false, true}) {
          Plan p = mixed_plan(16, stage, 1, 8);
          p.pipeline_stages = stages;
          p.global_batch = 8 * 16 / stages;
          p.pipeline.schedule = schedule;
          if (some_checkpointed) p.checkpointing = {Checkpointing::Mode::units, {0, 2}};  // the embedding and the head
          double time = 0;
          std::int64_t device = std::numeric_limits<std::int64_t>::max();
          for (const double ratio : {0.0, 0.05, 0.2, 0.5, 0.8, 1.0}) {
            p.offload.activations_ratio = ratio;
            SCOPED_TRACE(to_json_string(p));
            const double t = step_time_lower_bound(model, c, p);
            const std::int64_t d = memory_lower_bound(model, c, p).device_bytes;
            const Prediction pred = simulate(model, c, p);
            EXPECT_LE(t, pred.step_time_s);
            EXPECT_LE(d, pred.device.peak_bytes);
            EXPECT_GE(t, time);
            EXPECT_LE(d, device);
            time = t;
            device = d;
            ++plans;
          }
        }
      }
    }
  }
  EXPECT_EQ(plans, 216);
  // Not vacuous: one unit a stage, every saved byte beside the inputs copied out and back.
  Plan p = mixed_plan(16, 1, 1, 8);
  p.pipeline_stages = 8;
  p.global_batch = 8 * 16 / 8;
  const double none = step_time_lower_bound(model, c, p);
  const std::int64_t kept = memory_lower_bound(model, c, p).device_bytes;
  p.offload.activations_ratio = 1;
  const double all = step_time_lower_bound(model, c, p);
  EXPECT_GT(all, none * 1.05) << simulate(model, c, p).step_time_s;
  EXPECT_LT(memory_lower_bound(model, c, p).device_bytes, kept);
  p.offload.activations_ratio = 0.5;
  EXPECT_GT(memory_lower_bound(model, c, p).device_bytes, memory_lower_bound(model, c, [&] {
              Plan q = p;
              q.offload.activations_ratio = 1;
              return q;
            }()).device_bytes);
}

TEST(CollectiveTimeBound, NeverExceedsAnySplit) {
  std::mt19937 rng(7);
  const ClusterProfile clusters[] = {a100(1), a100(4), a100_with_convex_fits(1), cpu(4)};
  for (const ClusterProfile& c : clusters) {
    for (const CollOp op : {CollOp::all_reduce, CollOp::all_gather, CollOp::reduce_scatter}) {
      for (const int ranks : {2, 8, c.world_size()}) {
        if (ranks > c.world_size()) continue;
        for (const double total : {3e4, 5e6, 3e8}) {
          const double bound = collective_time_lower_bound(c, op, total, ranks, "fp16");
          EXPECT_GT(bound, 0) << c.name << " " << to_string(op) << " " << ranks;
          for (int trial = 0; trial < 20; ++trial) {
            const int pieces = 1 + trial % 10 + (trial >= 10 ? 200 : 0);
            std::vector<double> w(static_cast<std::size_t>(pieces));
            double sum = 0;
            for (double& x : w) sum += (x = std::uniform_real_distribution<double>(0.1, 1.0)(rng));
            for (const CollAlgo algo : {CollAlgo::ring, CollAlgo::tree, CollAlgo::best}) {
              CollectiveOptions o;
              o.algo = algo;
              o.dtype = "fp16";
              double t = 0;
              for (const double x : w) t += collective_time(c, op, total * x / sum, ranks, o);
              EXPECT_LE(bound, t * (1 + 1e-12)) << c.name << " " << to_string(op) << " " << ranks << " " << total << " in " << pieces;
            }
          }
        }
      }
    }
  }
  // The convex fit: 4 MB in one collective costs more than in two of 2 MB; the bound is below both.
  const ClusterProfile fits = a100_with_convex_fits(1);
  const double one = collective_time(fits, CollOp::all_gather, 4e6, 8, {});
  const double two = 2 * collective_time(fits, CollOp::all_gather, 2e6, 8, {});
  EXPECT_GT(one, 10 * two);
  EXPECT_LE(collective_time_lower_bound(fits, CollOp::all_gather, 4e6, 8, "fp32"), two * (1 + 1e-12));
}

}  // namespace
}  // namespace zeroplan::sim
