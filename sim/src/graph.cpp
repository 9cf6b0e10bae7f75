#include "zeroplan/sim/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <boost/graph/compressed_sparse_row_graph.hpp>
#include <boost/graph/depth_first_search.hpp>
#include <boost/graph/topological_sort.hpp>
#include <iterator>

#include "csr.h"
#include "zeroplan/sim/errors.h"

namespace zeroplan::sim {

namespace {

// Edges point from a dependency to the task that waits for it.
using Csr = boost::compressed_sparse_row_graph<boost::directedS>;

Csr make_graph(const TaskGraph& g) {
  std::vector<std::pair<std::size_t, std::size_t>> edges;
  edges.reserve(g.deps().size());
  for (const auto& [task, dep] : g.deps()) edges.emplace_back(dep, task);
  return Csr(boost::edges_are_unsorted_multi_pass, edges.begin(), edges.end(), g.num_tasks());
}

// Whether every dependency is an earlier task (the lowering adds a task after what it waits for, and
// add_dep mostly so): then the task ids are a topological order, no cycle is possible and one pass in id
// order finds the longest chain, with no depth-first search.
bool ids_in_dependency_order(const TaskGraph& g) {
  for (const auto& [task, dep] : g.deps())
    if (dep >= task) return false;
  return true;
}

// The longest chain's length in id order (REQUIRES ids_in_dependency_order), over the tasks waiting for
// each (lists kept per thread: the tuner bounds thousands of plans on each).
double longest_chain_in_id_order(const TaskGraph& g) {
  thread_local detail::Csr succ;
  thread_local std::vector<double> start;
  const auto& deps = g.deps();
  const auto n = static_cast<std::uint32_t>(g.tasks().size());
  succ.assign(n, static_cast<std::uint32_t>(deps.size()), [&](std::uint32_t i) { return deps[i].second; },
              [&](std::uint32_t i) { return deps[i].first; });
  return detail::longest_chain_in_id_order(n, succ, [&](std::uint32_t t) { return g.tasks()[t].duration_s; }, start);
}

struct FoundCycle {
  std::size_t from, to;
};

struct CycleVisitor : boost::default_dfs_visitor {
  template <class Edge, class Graph>
  void back_edge(Edge e, const Graph& gr) {
    throw FoundCycle{boost::source(e, gr), boost::target(e, gr)};
  }
};

}  // namespace

void check_acyclic(const TaskGraph& g) {
  if (ids_in_dependency_order(g)) return;
  const Csr gr = make_graph(g);
  std::vector<boost::default_color_type> color(g.num_tasks());
  try {
    boost::depth_first_search(
        gr, boost::visitor(CycleVisitor{}).color_map(boost::make_iterator_property_map(color.begin(),
                                                                                       boost::get(boost::vertex_index, gr))));
  } catch (const FoundCycle& c) {
    // c.to waits for c.from, and c.from (through others) waits for c.to.
    const std::string waiting = g.task_name(static_cast<TaskId>(c.to));
    throw CycleError(fmt::format("simulate: dependency cycle: task \"{}\" waits for \"{}\", which (through others) "
                                 "waits for \"{}\"",
                                 waiting, g.task_name(static_cast<TaskId>(c.from)), waiting));
  }
}

CriticalPath critical_path(const TaskGraph& g) {
  const Csr gr = make_graph(g);
  std::vector<std::size_t> order;
  order.reserve(g.num_tasks());
  boost::topological_sort(gr, std::back_inserter(order));  // reverse topological order
  const auto& tasks = g.tasks();
  std::vector<double> finish(g.num_tasks(), 0.0);  // longest chain ending at v, including v
  std::vector<TaskId> prev(g.num_tasks(), kNone);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const std::size_t v = *it;
    finish[v] += tasks[v].duration_s;
    for (auto [e, end] = boost::out_edges(v, gr); e != end; ++e) {
      const std::size_t w = boost::target(*e, gr);
      if (finish[v] > finish[w]) {  // finish[w] holds its best start until w is visited
        finish[w] = finish[v];
        prev[w] = static_cast<TaskId>(v);
      }
    }
  }
  CriticalPath cp;
  if (g.num_tasks() == 0) return cp;
  auto last = static_cast<TaskId>(std::max_element(finish.begin(), finish.end()) - finish.begin());
  cp.length_s = finish[last];
  for (TaskId v = last; v != kNone; v = prev[v]) cp.tasks.push_back(v);
  std::reverse(cp.tasks.begin(), cp.tasks.end());
  return cp;
}

double longest_chain_s(const TaskGraph& g) {
  return ids_in_dependency_order(g) ? longest_chain_in_id_order(g) : critical_path(g).length_s;
}

namespace {

// max(chain, each resource's work, each shared group's work / capacity); `work(r)` is resource r's.
template <class Work>
double bound_of(const TaskGraph& g, double chain, Work work) {
  double bound = chain;
  std::vector<double> per_group(g.groups().size(), 0.0);
  // A group with a member at its own contended rate may do more than its capacity at once: no bound.
  std::vector<char> shares(g.groups().size(), 1);
  for (std::size_t r = 0; r < g.resources().size(); ++r) {
    bound = std::max(bound, work(r));
    if (const GroupId gr = g.resources()[r].group; gr != kNone) {
      per_group[gr] += work(r);
      if (g.resources()[r].contended_rate > 0) shares[gr] = 0;
    }
  }
  for (std::size_t i = 0; i < per_group.size(); ++i)
    if (shares[i]) bound = std::max(bound, per_group[i] / g.groups()[i].capacity);
  return bound;
}

}  // namespace

double makespan_lower_bound(const TaskGraph& g) {
  std::vector<double> per_resource(g.resources().size(), 0.0);
  for (const Task& t : g.tasks()) per_resource[t.resource] += t.duration_s;
  return bound_of(g, longest_chain_s(g), [&](std::size_t r) { return per_resource[r]; });
}

double makespan_lower_bound(const TaskGraph& g, const SimResult& run) {
  // A resource's work_s sums its durations in its queue's order, which is id order, as the loop above.
  const double chain = run.longest_chain_s >= 0 ? run.longest_chain_s : longest_chain_s(g);
  return bound_of(g, chain, [&](std::size_t r) { return run.resources[r].work_s; });
}

}  // namespace zeroplan::sim
