// Graph questions about a TaskGraph answered with Boost.Graph: acyclicity and the critical path.
#pragma once

#include <vector>

#include "zeroplan/sim/engine.h"
#include "zeroplan/sim/task_graph.h"

namespace zeroplan::sim {

// Throws CycleError naming a task on a cycle of dependencies.
void check_acyclic(const TaskGraph& graph);

struct CriticalPath {
  double length_s = 0;         // longest chain of stand-alone durations through the dependencies
  std::vector<TaskId> tasks;   // that chain, first to last
};

// Longest dependency chain, ignoring resource order and contention: a lower bound on the makespan.
// REQUIRES: graph is acyclic.
CriticalPath critical_path(const TaskGraph& graph);
// critical_path(graph).length_s, in one pass in id order when every dependency is an earlier task (the
// lowering's graphs), else by critical_path.
double longest_chain_s(const TaskGraph& graph);

// max(critical path, the busiest resource's work, each shared group's work / capacity): no schedule of
// this graph is shorter.
double makespan_lower_bound(const TaskGraph& graph);
// The same from a completed run of the graph: its longest chain and each resource's work as the run
// found them (the same sums), without a pass over the tasks.
double makespan_lower_bound(const TaskGraph& graph, const SimResult& run);

}  // namespace zeroplan::sim
