// Enumeration of the discrete knobs, one expansion step per knob. A step turns each partial plan into
// one plan per value of its knob; a value that makes the plan invalid is dropped and counted by reason.
#include "zeroplan/tuner/space.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>

#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/knobs.h"

#include "space_internal.h"

namespace zeroplan::tuner {

using namespace space_detail;

namespace {

WorldChoice choose_world(const ClusterProfile& cluster, const TuneConstraints& c, int nodes, std::vector<std::string>& notes) {
  const int dpn = cluster.devices_per_node;
  const int devices = nodes * dpn;
  if (c.world_size > 0) {
    if (c.world_size > devices)
      throw SchemaError(fmt::format("tune: world_size {} > {} nodes x {} devices (= {})", c.world_size, nodes, dpn, devices));
    if (c.global_batch % c.world_size != 0)
      throw SchemaError(fmt::format("tune: global_batch {} is not a multiple of world_size {} (micro batch x microbatches "
                                    "x world size must equal it)",
                                    c.global_batch, c.world_size));
    return {c.world_size, (c.world_size + dpn - 1) / dpn};
  }
  for (int k = nodes; k >= 1; --k) {
    if (c.global_batch % (k * dpn) == 0) {
      if (k != nodes)
        notes.push_back(fmt::format("global batch {} is not a multiple of {} devices ({} nodes x {}): using {} nodes "
                                    "({} ranks), the most whole nodes whose rank count divides it",
                                    c.global_batch, devices, nodes, dpn, k, k * dpn));
      return {k * dpn, k};
    }
  }
  for (int w = std::min(dpn, devices) - 1; w >= 1; --w) {
    if (c.global_batch % w == 0) {
      notes.push_back(fmt::format("global batch {} divides no whole-node rank count: using {} ranks of one node",
                                  c.global_batch, w));
      return {w, 1};
    }
  }
  return {1, 1};
}


}  // namespace

std::int64_t Space::invalid_total() const {
  std::int64_t n = 0;
  for (const auto& [why, count] : invalid) n += count;
  return n;
}

std::vector<std::string> supported_precisions(const ClusterProfile& cluster) {
  std::vector<std::string> out = {"fp32"};
  for (const char* d : {"bf16", "fp16"})
    if (cluster.device.peak_flops.contains(d)) out.emplace_back(d);
  return out;
}

ClusterProfile constrained_cluster(const ClusterProfile& cluster, const TuneConstraints& constraints) {
  ClusterProfile c = cluster;
  if (constraints.nodes > 0) c.nodes = constraints.nodes;
  return c;
}


Space enumerate_space(const ModelProfile& model, const ClusterProfile& cluster_in, const TuneConstraints& c) {
  validate(c);
  const ClusterProfile cluster = constrained_cluster(cluster_in, c);
  Space s;
  s.nodes_available = cluster.nodes;
  const WorldChoice w = choose_world(cluster, c, cluster.nodes, s.notes);
  s.world_size = w.world;
  s.nodes_used = w.nodes_used;
  const int per_rank = c.global_batch / w.world;
  const int units = model.expanded_unit_count();

  Plan base;
  base.world_size = w.world;
  base.global_batch = c.global_batch;
  base.micro_batch = per_rank;
  base.microbatches = 1;
  base.optimizer.name = c.optimizer;
  // The fixed values, then the registry's dependent defaults for the knobs not fixed: the other half of
  // the batch split follows a fixed half, reshard_after_forward follows a fixed zero_stage 3.
  const Plan unfixed = base;
  std::set<std::string> given;
  for (const auto& [key, value] : c.fixed) {
    apply_fixed(base, key, value);
    if (const Knob* k = find_knob(key)) given.insert(k->name);
    else
      for (const Knob* k : tune_knob_members(key)) given.insert(k->name);  // a preset (precision, buckets)
  }
  apply_dependent_defaults(unfixed, base, given);
  s.base = base;

  Expander e({base}, s.invalid);
  static_assert(kSteps == 20);
  const Rules rules(step_knobs(), c.runnable);
  Enumeration x{e, rules, c, cluster, w, units, base, s};
  x.expand_sharding();
  x.expand_pipeline();
  x.expand_offload_model();
  x.expand_rest();
  x.make_candidates(model);
  return s;
}


}  // namespace zeroplan::tuner
