// One step of GPT-3 175B (analytic profile: 96 layers, hidden 12288, 96 heads, sequence 2048) at ZeRO
// stage 3 with optimizer, gradient and parameter offload, 8 microbatches, on 128 nodes of 8 x A100-80GB.
// Reports time per simulated step and tasks per second (CPU time) for the whole simulation (lowering,
// run and the Prediction), the lowering alone and the engine alone.
#include <benchmark/benchmark.h>

#include "fixtures.h"
#include "zeroplan/sim/engine.h"
#include "zeroplan/sim/simulate.h"

namespace {

using namespace zeroplan;

struct Gpt3 {
  ModelProfile model = sim::testing::gpt(96, 12288, 96, 2048);
  ClusterProfile cluster = sim::testing::a100(128);
  Plan plan = [] {
    Plan p = sim::testing::mixed_plan(1024, 3, 1, 8);
    p.offload.optimizer = p.offload.grads = p.offload.params = true;
    return p;
  }();
};

// Tasks per iteration: "tasks" and, divided by the CPU time, "tasks/s".
void count_tasks(benchmark::State& state, std::size_t tasks) {
  state.counters["tasks"] = static_cast<double>(tasks);
  state.counters["tasks/s"] = benchmark::Counter(static_cast<double>(tasks), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Gpt3StepSimulate(benchmark::State& state) {
  const Gpt3 g;
  std::size_t tasks = 0;
  for (auto _ : state) {
    sim::Simulation s = sim::simulate_step(g.model, g.cluster, g.plan, sim::SimOptions{});
    tasks = s.graph.num_tasks();
    benchmark::DoNotOptimize(s.prediction.step_time_s);
  }
  count_tasks(state, tasks);
}
BENCHMARK(BM_Gpt3StepSimulate)->Unit(benchmark::kMillisecond);

void BM_Gpt3StepLowerOnly(benchmark::State& state) {
  const Gpt3 g;
  std::size_t tasks = 0;
  for (auto _ : state) {
    sim::TaskGraph graph = sim::lower_step(g.model, g.cluster, g.plan);
    tasks = graph.num_tasks();
    benchmark::DoNotOptimize(graph);
  }
  count_tasks(state, tasks);
}
BENCHMARK(BM_Gpt3StepLowerOnly)->Unit(benchmark::kMillisecond);

void BM_Gpt3StepEngineOnly(benchmark::State& state) {
  const Gpt3 g;
  const sim::TaskGraph graph = sim::lower_step(g.model, g.cluster, g.plan);
  for (auto _ : state) {
    sim::SimResult r = sim::run(graph, false);
    benchmark::DoNotOptimize(r.makespan_s);
  }
  count_tasks(state, graph.num_tasks());
}
BENCHMARK(BM_Gpt3StepEngineOnly)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
