// zeroplan simulate: one training step of a Plan on a cluster, from a ModelProfile -> Prediction.
#include <fmt/core.h>

#include <fstream>
#include <memory>
#include <tuple>

#include "cli.h"
#include "plan_args.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/sim/errors.h"
#include "zeroplan/sim/simulate.h"
#include "zeroplan/tuner/exports.h"

namespace zeroplan::cli {
namespace {

struct SimulateArgs {
  std::string model, cluster, trace, output, for_tool;
  PlanArgs plan;
  bool explain = false;
};

void print_pool(const char* name, const PoolPeak& p) {
  fmt::print(stderr, "  peak {:<6} {:>12} + allocator overhead {:>10} of {:>12}  {}\n", name,
             gib(p.peak_bytes), gib(p.allocator_overhead_bytes), gib(p.capacity_bytes),
             p.fits() ? "fits" : fmt::format("DOES NOT FIT (short by {})", gib(p.total_bytes() - p.capacity_bytes)));
}

void print_summary(const Prediction& p) {
  fmt::print(stderr, "prediction: {} on {} ({} ranks), zero_stage {}\n", p.model, p.cluster,
             p.plan.world_size, p.plan.zero_stage);
  fmt::print(stderr, "  step time     {:.6f} s   ({:.1f} samples/s)\n", p.step_time_s, p.samples_per_s);
  if (p.sync_step_time_s != p.step_time_s)
    fmt::print(stderr, "  sync step     {:.6f} s   (LocalSGD/SlowMo averaging step)\n", p.sync_step_time_s);
  fmt::print(stderr, "  lower bound   {:.6f} s   (step is {:.1f}% above it)\n", p.lower_bound_s,
             p.lower_bound_s > 0 ? 100.0 * (p.step_time_s / p.lower_bound_s - 1.0) : 0.0);
  fmt::print(stderr, "  bound by      {}\n", p.bound);
  fmt::print(stderr, "  communication {:.6f} s exposed, {:.6f} s overlapped\n", p.exposed_comm_s, p.overlapped_comm_s);
  for (const auto& [resource, busy] : p.resource_busy_s)
    fmt::print(stderr, "  busy {:<16} {:.6f} s\n", resource, busy);
  print_pool("device", p.device);
  print_pool("host", p.host);
  const ModelStates& m = p.model_states;
  for (const auto& [pool, params, grads, optimizer, total] :
       {std::tuple{"device", m.device_params, m.device_grads, m.device_optimizer, m.device_bytes()},
        std::tuple{"host", m.host_params, m.host_grads, m.host_optimizer, m.host_bytes()}}) {
    if (total > 0)
      fmt::print(stderr, "  model states {:<6} {:>12} = params {} + grads {} + optimizer {} (held all step, ZeRO's count)\n",
                 pool, gib(total), gib(params), gib(grads), gib(optimizer));
  }
  if (!p.stages.empty()) {
    fmt::print(stderr, "  pipeline      {} stages x {} microbatches, {}; bubble {:.1f}% of the stages' time\n", p.stages.size(),
               p.plan.microbatches, p.plan.pipeline.schedule, 100 * p.bubble_fraction);
    for (std::size_t i = 0; i < p.stages.size(); ++i)
      fmt::print(stderr, "    stage {:<3} units {:>3}..{:<3} peak device {:>12}, compute busy {:.6f} s\n", i,
                 p.stages[i].first_unit, p.stages[i].first_unit + p.stages[i].units - 1,
                 gib(p.stages[i].device.total_bytes()), p.stages[i].compute_busy_s);
  }
  for (const auto& note : p.notes) fmt::print(stderr, "  note: {}\n", note);
}

int run_simulate(const SimulateArgs& a, const Globals& g) {
  auto model = read_document<ModelProfile>(a.model);
  auto cluster = resolve_cluster(a.cluster);
  Plan plan = cli::plan_from_args(a.plan);
  validate(plan, model);
  sim::Simulation s = sim::simulate_step(model, cluster, plan);
  const std::int64_t tool_bytes = a.for_tool.empty() ? 0 : tuner::add_tool_memory(s.prediction, a.for_tool, plan, model);
  if (!a.trace.empty()) {
    std::ofstream out(a.trace, std::ios::binary);
    out << s.trace_json();
    if (!out) throw ExitError(kBadInput, fmt::format("{}: cannot write the trace", a.trace));
    s.prediction.trace_path = a.trace;
  }
  if (!g.quiet) {
    print_summary(s.prediction);
    if (a.explain) {
      fmt::print(stderr, "{}", s.explain_text());
      if (tool_bytes > 0)
        fmt::print(stderr, "device peak with --for {}: + {} B of \"{}\" (held all step; in the Prediction's resident "
                   "list)\n", a.for_tool, tool_bytes, tuner::kDeepSpeedPartitionsName);
    }
  }
  if (!a.output.empty()) write_document(a.output, s.prediction);
  if (g.json) fmt::print("{}", to_json_string(s.prediction));
  return kOk;
}

}  // namespace

Action add_simulate(CLI::App& app, const Globals& globals) {
  auto a = std::make_shared<SimulateArgs>();
  app.add_option("--model", a->model, "ModelProfile (from zeroplan profile)")->required()->check(model_profile_file());
  app.add_option("--cluster", a->cluster, "Cluster: shipped NAME[:NODES] or FILE[:NODES]")->required();
  app.add_option("--plan", a->plan.file, "Plan file (default: DDP, no offload)")->check(CLI::ExistingFile);
  app.add_option("--set", a->plan.sets, "Plan knob key=value, dotted (offload.params=true); repeatable; knobs: zeroplan plan --fields");
  app.add_option("--world-size", a->plan.world_size, "Ranks (data-parallel size x pipeline stages)")
      ->check(number_in(1, 1 << 20));
  app.add_option("--global-batch", a->plan.global_batch, "Samples per optimizer step");
  app.add_option("--trace", a->trace, "Write the simulated step as a Chrome trace (Perfetto)")->check(output_path());
  app.add_flag("--explain", a->explain, "List the memory at each pool's peak by category");
  app.add_option("--for", a->for_tool,
                 "Predict this tool running the plan: the device peak counts what it holds beyond zeroplan's executor "
                 "(deepspeed: its own ZeRO-3 partitions), as tune --for does")
      ->check(CLI::IsMember(tuner::export_tools()));
  app.add_option("-o,--output", a->output, "Write the Prediction here")->check(output_path());
  return [a, &globals] { return run_simulate(*a, globals); };  // errors: main.cpp's one map
}

}  // namespace zeroplan::cli
