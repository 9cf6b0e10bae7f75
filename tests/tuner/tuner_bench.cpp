// Benchmark: the whole tune of GPT-3 175B (analytic profile) on 128 nodes of 8 x A100-80GB, global batch
// 1536, pipeline stages in the space (NoPipelines: fixed to 1, for comparison). Reports candidates,
// simulations, plans simulated per second and the wall time of one tune. Target: under 1 s on 2 cores.
// And a 1T-parameter GPT on 4,096 H100s (issue #35: every knob, pipeline stages included, under 2 s).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <sys/resource.h>

#include <cstdlib>
#include <thread>

#include "analytic_gpt.h"
#include "zeroplan/profiles/analytic.h"
#include "zeroplan/profiles/cluster.h"
#include "zeroplan/tuner/report.h"
#include "zeroplan/tuner/tune.h"

namespace {

using namespace zeroplan;

// The embedding with FLOPs, as the tuner's tests have it.
ModelProfile gpt3_175b() { return fixtures::with_embedding_flops(analytic_gpt(fixtures::gpt3_175b())); }

// CPU seconds of the whole process (every worker thread), user + system.
double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// ZEROPLAN_BENCH_REPORT_DIR=dir writes the last tune's reports there (to look at what the benchmark finds).
// A 1T-parameter GPT (128 layers, hidden 25600, 160 heads, sequence 2048: 1.008e12 parameters), the
// issue #35 case: every knob, pipeline stages included, on 512 nodes of 8 x H100 (4,096 GPUs).
ModelProfile gpt_1t() {
  AnalyticGptOptions o = fixtures::gpt_options(128, 25600, 160, 2048, 50257, "bf16", "gpt-1t");
  o.flash_attention = true;
  return fixtures::with_embedding_flops(analytic_gpt(o));
}

void run(benchmark::State& state, bool averaging, bool pipelines = true, bool trillion = false) {
  const ModelProfile model = trillion ? gpt_1t() : gpt3_175b();
  const ClusterProfile cluster = resolve_cluster(trillion ? "h100-sxm-80gb:512" : "a100-sxm-80gb:128");
  tuner::TuneConstraints c;
  c.set_global_batch(trillion ? 4096 : 1536).set_allow_approximate_averaging(averaging);
  if (!pipelines) c.fix("pipeline_stages", "1");
  tuner::TuneOptions opt;
  opt.set_threads(static_cast<int>(state.range(0)));
  tuner::TuneResult r;
  const double cpu0 = process_cpu_s();
  for (auto _ : state) {
    r = tuner::tune(model, cluster, c, opt);
    benchmark::DoNotOptimize(r.fitting);
  }
  state.counters["process_cpu_s_per_tune"] = (process_cpu_s() - cpu0) / static_cast<double>(state.iterations());
  if (const char* dir = std::getenv("ZEROPLAN_BENCH_REPORT_DIR")) tuner::write_reports(r, std::string(dir) + (averaging ? "/localsgd" : "/default"));
  state.counters["candidates"] = static_cast<double>(r.candidates);
  state.counters["simulations"] = static_cast<double>(r.simulations);
  state.counters["bound_prunes"] = static_cast<double>(r.bound_prunes);
  state.counters["dominated"] = static_cast<double>(r.rejections.dominated);
  state.counters["fitting"] = static_cast<double>(r.fitting);
  state.counters["plans_simulated_per_s"] =
      benchmark::Counter(static_cast<double>(r.simulations) * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["tune_wall_s"] = r.wall_time_s;
  if (const auto* best = r.best())
    state.SetLabel(fmt::format("world {}, best {:.3f} s/step {:.1f} samples/s, stage {}", r.world_size, best->prediction.step_time_s,
                               best->prediction.samples_per_s, best->plan.zero_stage));
}

void BM_TuneGpt3_175B(benchmark::State& state) { run(state, false); }
void BM_TuneGpt3_175B_WithLocalSgd(benchmark::State& state) { run(state, true); }
void BM_TuneGpt3_175B_NoPipelines(benchmark::State& state) { run(state, false, false); }
void BM_TuneGpt_1T_4096Gpus(benchmark::State& state) { run(state, false, true, true); }

BENCHMARK(BM_TuneGpt3_175B)->Arg(2)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK(BM_TuneGpt3_175B_WithLocalSgd)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK(BM_TuneGpt3_175B_NoPipelines)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK(BM_TuneGpt_1T_4096Gpus)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
