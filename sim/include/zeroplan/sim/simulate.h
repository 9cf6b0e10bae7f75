// Simulating one training step: Plan x ModelProfile x ClusterProfile -> tasks -> Prediction.
//
//   Simulation s = simulate_step(model, cluster, plan);     // everything
//   s.prediction                                             // the document
//   s.trace_json()                                           // Chrome trace of the step
//   s.explain                                                // memory at the peak by category and name
//   Prediction p = simulate(model, cluster, plan);           // just the document
//
// Errors a user can cause (an invalid plan, a unit with no time and no FLOPs, a plan the simulator does
// not model) throw SchemaError or SimError with a one-line message.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/profiles/prediction.h"
#include "zeroplan/sim/cost_models.h"
#include "zeroplan/sim/engine.h"
#include "zeroplan/sim/task_graph.h"

namespace zeroplan::sim {

struct SimOptions {
  // CPU clusters (ClusterProfile::shares_cores): compute, copies, collectives and the host optimizer
  // split the cores; tasks running at once share this capacity (1: they split the cores evenly).
  double cpu_core_capacity = 1.0;
  // GPU clusters across nodes: copies and inter-node collectives share PCIe; two directions.
  double pcie_capacity = 2.0;
  CollAlgo collective_algo = CollAlgo::ring;
  bool check_cycles = true;

  SimOptions& set_cpu_core_capacity(double v) { cpu_core_capacity = v; return *this; }
  SimOptions& set_collective_algo(CollAlgo v) { collective_algo = v; return *this; }
};

// The memory at a pool's peak, for --explain.
struct PoolExplain {
  std::string pool;                  // "device" | "host"
  std::int64_t peak_bytes = 0;       // allocations, without allocator overhead
  std::int64_t allocator_overhead_bytes = 0;
  std::int64_t capacity_bytes = 0;
  double at_s = 0;
  std::array<std::int64_t, kNumMemCategories> by_category{};  // params .. overhead (overhead = allocator)
  std::vector<zeroplan::sim::ResidentItem> items;             // by category, largest first
  std::int64_t model_state_bytes() const;                      // params + grads + optimizer
};

struct MemoryExplain {
  PoolExplain device;
  PoolExplain host;
};

struct Simulation {
  Prediction prediction;
  TaskGraph graph;
  SimResult result;
  MemoryExplain explain;
  double sync_extra_s = 0;  // LocalSGD/SlowMo: what a synchronising step adds to an ordinary one

  std::string trace_json() const;
  // Human-readable --explain: one line per category and item at each pool's peak.
  std::string explain_text() const;
};

// Builds the task graph of one step (the lowering) without running it.
TaskGraph lower_step(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan,
                     const SimOptions& options = {});

Simulation simulate_step(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan,
                         const SimOptions& options = {});

Prediction simulate(const ModelProfile& model, const ClusterProfile& cluster, const Plan& plan,
                    const SimOptions& options = {});

}  // namespace zeroplan::sim
