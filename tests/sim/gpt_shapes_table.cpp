// Predictions, not measurements: simulated TFLOPS per GPU and where one training step's time goes for
// public GPT shapes on the shipped A100 and H100 clusters, from the per-op GPU time model (issue #19).
// The cluster numbers come from datasheets and published
// microbenchmarks (profiles/data/clusters/SOURCES.md), with the calibration terms fitted to llm-foundry's
// MPT benchmarks beside them (zeroplan calibrate). Prints a markdown table on stdout.
//   build-notorch/tests/sim/gpt_shapes_table
#include <fmt/format.h>

#include <string>
#include <vector>

#include "analytic_gpt.h"
#include "zeroplan/profiles/analytic.h"
#include "zeroplan/profiles/cluster.h"
#include "zeroplan/sim/cost_models.h"
#include "zeroplan/sim/simulate.h"

namespace {

using namespace zeroplan;

struct Shape {
  const char* name;
  std::int64_t layers, hidden, heads, seq;
  int world, micro_batch;
};

// GPT-2 XL (Radford et al. 2019) and GPT-3 6.7B, 13B, 175B (Brown et al. 2020, Table 2.1); vocab 50257.
const Shape kShapes[] = {
    {"GPT-2 1.5B", 48, 1600, 25, 1024, 8, 8},
    {"GPT-3 6.7B", 32, 4096, 32, 2048, 64, 4},
    {"GPT-3 13B", 40, 5120, 40, 2048, 64, 4},
    {"GPT-3 175B", 96, 12288, 96, 2048, 1024, 1},
};

// ZeRO-3 (FSDP FULL_SHARD, resharding after forward), bf16 parameters and compute with an fp32 master
// and Adam, every unit checkpointed, one microbatch per step.
Plan plan_for(const Shape& s) {
  Plan p;
  p.world_size = s.world;
  p.micro_batch = s.micro_batch;
  p.microbatches = 1;
  p.global_batch = s.micro_batch * s.world;
  p.zero_stage = 3;
  p.reshard_after_forward = true;
  p.precision.param_dtype = p.precision.compute_dtype = p.precision.reduce_dtype = "bf16";
  p.precision.master_fp32 = true;
  p.checkpointing.mode = Checkpointing::Mode::all;
  return p;
}

}  // namespace

int main() {
  fmt::print("| model | cluster | GPUs | micro batch | step (s) | model TFLOPS/GPU | of bf16 peak | GEMM (s) | "
             "attention (s) | memory-bound (s) | launches (s) | communication (s) | exposed comm. (s) | device peak (GiB) |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const char* cluster_name : {"a100-sxm-80gb", "h100-sxm-80gb"}) {
    for (const Shape& s : kShapes) {
      const int nodes = (s.world + 7) / 8;
      const ClusterProfile cluster = resolve_cluster(fmt::format("{}:{}", cluster_name, nodes));
      AnalyticGptOptions o = fixtures::gpt_options(s.layers, s.hidden, s.heads, s.seq, 50257, "bf16", s.name);
      o.batch = s.micro_batch;
      o.flash_attention = true;
      const ModelProfile model = analytic_gpt(o);
      const Plan plan = plan_for(s);
      const Prediction pred = sim::simulate(model, cluster, plan);
      // Where the compute goes on one GPU in one step: forward, backward, and the recompute of every
      // checkpointed unit's forward, per microbatch.
      sim::ComputeParts parts;
      double model_flops = 0;
      for (int i = 0; i < static_cast<int>(model.units.size()); ++i) {
        const UnitProfile& u = model.units[static_cast<std::size_t>(i)];
        const sim::ComputeTime t = sim::unit_compute_time(model, i, cluster, plan.micro_batch, "bf16");
        for (int r = 0; r < u.count * plan.microbatches; ++r) {
          parts += t.fwd_parts;
          parts += t.bwd_parts;
          if (plan.checkpointing.applies_to(i)) parts += t.fwd_parts;
        }
        model_flops += (u.flops_fwd.at(plan.micro_batch, model.batch) + u.flops_bwd.at(plan.micro_batch, model.batch)) *
                       u.count * plan.microbatches;
      }
      double comm = 0;
      for (const auto& [resource, busy] : pred.resource_busy_s)
        if (resource.rfind("comm", 0) == 0) comm += busy;
      const double tflops = model_flops / pred.step_time_s / 1e12;
      fmt::print("| {} | {} | {} | {} | {:.3f} | {:.0f} | {:.0f}% | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.1f} |\n",
                 s.name, cluster_name, s.world, s.micro_batch, pred.step_time_s, tflops,
                 100 * tflops * 1e12 / cluster.device.peak_flops.at("bf16"), parts.gemm_s, parts.attention_s,
                 parts.memory_s, parts.launch_s, comm, pred.exposed_comm_s,
                 static_cast<double>(pred.device.total_bytes()) / (1 << 30));
    }
  }
  return 0;
}
