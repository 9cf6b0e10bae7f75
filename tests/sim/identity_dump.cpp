// Simulates many plan variants of a few analytic profiles and prints, per variant, the prediction (JSON)
// and hashes of the trace, the explanation and the raw engine result: diffed between two builds to show
// a change to the simulator keeps every output bit for bit.
#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "fixtures.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/sim/engine.h"
#include "zeroplan/sim/simulate.h"

namespace {

using namespace zeroplan;

std::uint64_t fnv(const void* p, std::size_t n, std::uint64_t h = 1469598103934665603ULL) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}
std::uint64_t fnv(const std::string& s, std::uint64_t h = 1469598103934665603ULL) { return fnv(s.data(), s.size(), h); }

std::uint64_t hash_result(const sim::SimResult& r) {
  std::uint64_t h = fnv(r.start_s.data(), r.start_s.size() * sizeof(double));
  h = fnv(r.end_s.data(), r.end_s.size() * sizeof(double), h);
  h = fnv(&r.makespan_s, sizeof(double), h);
  h = fnv(&r.events, sizeof(r.events), h);
  for (const auto& x : r.resources) {
    h = fnv(&x.busy_s, sizeof(double), h);
    h = fnv(&x.work_s, sizeof(double), h);
    h = fnv(&x.tasks, sizeof(x.tasks), h);
  }
  for (const auto& p : r.pools) {
    h = fnv(&p.peak_bytes, 8, h);
    h = fnv(&p.peak_time_s, 8, h);
    h = fnv(&p.end_bytes, 8, h);
    h = fnv(&p.reserved_bytes, 8, h);
    for (const auto& [t, b] : p.timeline) {
      h = fnv(&t, 8, h);
      h = fnv(&b, 8, h);
    }
    for (const auto& it : p.resident_at_peak) {
      h = fnv(it.name, h);
      h = fnv(&it.bytes, 8, h);
      h = fnv(&it.count, 4, h);
    }
  }
  return h;
}

struct Profile {
  std::string name;
  ModelProfile model;
  ClusterProfile cluster;
  int world;
};

int run_all(bool traces) {
  std::vector<Profile> profiles;
  profiles.push_back({"gpt3-a100x1024", sim::testing::gpt(96, 12288, 96, 2048), sim::testing::a100(128), 1024});
  profiles.push_back({"gpt2tiny-cpu2", sim::testing::gpt(2, 64, 2, 32, 1000), sim::testing::cpu(2), 2});
  {
    Profile p{"gpt2tiny-cpu4-skew", sim::testing::gpt(4, 64, 2, 32, 1000), sim::testing::cpu(4), 4};
    p.model.measured = true;
    p.model.device = "cpu";
    p.model.rank_skew = 0.1;
    p.model.concurrent_ranks = 2;
    p.cluster.core_contention.compute_with_comm_slowdown = 1.3;
    p.cluster.core_contention.comm_with_compute_slowdown = 1.6;
    profiles.push_back(p);
  }
  {
    Profile p{"gpt-medium-a100x16-sm", sim::testing::gpt(12, 768, 12, 1024), sim::testing::a100(2), 16};
    p.cluster.calibration.compute_with_comm_slowdown = 1.2;
    profiles.push_back(p);
  }
  profiles.push_back({"gpt-medium-a100x8", sim::testing::gpt(12, 768, 12, 1024), sim::testing::a100(1), 8});
  int n = 0;
  for (const Profile& pr : profiles) {
    for (int stage = 0; stage <= 3; ++stage)
      for (int pp : {1, 2, 4})
        for (int mb : {1, 2, 4, 8})
          for (int off : {0, 1, 3, 5, 7})
            for (double act : {0.0, 0.5, 1.0})
              for (int ck = 0; ck < 2; ++ck)
                for (double cap : {1.0, 0.5}) {
                  if (pp > 1 && (off != 0 && off != 7)) continue;
                  if (cap != 1.0 && !pr.cluster.shares_cores) continue;
                  if (pr.world < pp) continue;
                  Plan plan = sim::testing::mixed_plan(pr.world, stage, 1, mb);
                  plan.pipeline_stages = pp;
                  plan.global_batch = mb * (pr.world / pp);
                  if (off == 5) plan.buckets.prefetch = false;
                  if (pp > 1) plan.pipeline.schedule = (mb % 2 == 0) ? "1f1b" : "gpipe";
                  plan.offload.optimizer = (off & 1) != 0;
                  plan.offload.grads = (off & 2) != 0;
                  plan.offload.params = (off & 4) != 0;
                  plan.offload.activations_ratio = act;
                  if (act == 0.5) plan.offload.activations_prefetch_bytes = 0;
                  if (ck) plan.checkpointing.mode = Checkpointing::Mode::all;
                  if (stage == 3) plan.reshard_after_forward = (mb != 2);
                  sim::SimOptions opt;
                  opt.cpu_core_capacity = cap;
                  const std::string key = fmt::format("{} stage={} pp={} mb={} off={} act={} ck={} cap={}", pr.name,
                                                      stage, pp, mb, off, act, ck, cap);
                  ++n;
                  try {
                    sim::Simulation s = sim::simulate_step(pr.model, pr.cluster, plan, opt);
                    const sim::SimResult direct = sim::run(s.graph, true);
                    std::cout << "== " << key << " tasks=" << s.graph.num_tasks() << "\n";
                    std::cout << to_json_string(s.prediction);
                    std::cout << fmt::format("result {:016x} direct {:016x} explain {:016x}", hash_result(s.result),
                                             hash_result(direct), fnv(s.explain_text()));
                    if (traces) std::cout << fmt::format(" trace {:016x}", fnv(s.trace_json()));
                    std::cout << "\n";
                  } catch (const std::exception& e) {
                    std::cout << "== " << key << " error: " << e.what() << "\n";
                  }
                }
  }
  std::cerr << n << " variants\n";
  return 0;
}

// sim_bench's GPT-3 step, `reps` times: the engine alone ("engine"), the lowering ("lower") or the whole step.
int repeat(const std::string& what, int reps) {
  const ModelProfile model = sim::testing::gpt(96, 12288, 96, 2048);
  const ClusterProfile cluster = sim::testing::a100(128);
  Plan plan = sim::testing::mixed_plan(1024, 3, 1, 8);
  plan.offload.optimizer = plan.offload.grads = plan.offload.params = true;
  const sim::TaskGraph graph = sim::lower_step(model, cluster, plan);
  if (what == "stats") {
    const sim::SimResult r = sim::run(graph, false);
    std::size_t zero = 0;
    for (const auto& t : graph.tasks()) zero += t.duration_s <= 0;
    std::cout << fmt::format("tasks {} zero-duration {} deps {} allocs {} resources {} groups {} pools {} events {}\n",
                             graph.num_tasks(), zero, graph.deps().size(), graph.allocs().size(),
                             graph.resources().size(), graph.groups().size(), graph.pools().size(), r.events);
    for (const auto& x : r.resources) std::cout << x.name << " " << x.tasks << "\n";
    for (const auto& p : r.pools) std::cout << p.name << " timeline " << p.timeline.size() << "\n";
    return 0;
  }
  double sum = 0;
  for (int i = 0; i < reps; ++i) {
    if (what == "engine") sum += sim::run(graph, false).makespan_s;
    else if (what == "lower") sum += static_cast<double>(sim::lower_step(model, cluster, plan).num_tasks());
    else sum += sim::simulate_step(model, cluster, plan).prediction.step_time_s;
  }
  std::cout << sum << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2) return repeat(argv[1], std::atoi(argv[2]));
  return run_all(!(argc > 1 && std::strcmp(argv[1], "--no-traces") == 0));
}
