// The search space: every combination of the knobs that may vary, minus the invalid ones (never
// simulated, counted by reason). Continuous knobs (activation offload ratio, the set of checkpointed
// units) are not enumerated: each candidate says which of them the search fits (search.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/tuner/constraints.h"

namespace zeroplan::tuner {

struct Candidate {
  Plan plan;                       // the continuous knobs at their least-saving values when free
  bool fit_activations = false;    // find the smallest activation offload ratio that fits
  bool fit_checkpointing = false;  // try no checkpointing, the cheapest unit sets, then all
  bool fit_checkpoint_offload = false;  // with fit_checkpointing: each level with its kept inputs on the
                                        // device, then on the host (checkpoint_offload)

  bool operator==(const Candidate&) const = default;
};

struct Space {
  int world_size = 1;       // ranks every plan uses
  int nodes_used = 1;       // nodes those ranks occupy
  int nodes_available = 1;  // nodes the constraints allow
  Plan base;                // defaults with the fixed values applied (world, batch, optimizer)
  std::vector<Candidate> candidates;  // deterministic order
  // Partial combinations cut at the knob that makes them invalid, by reason ("reshard_after_forward
  // requires zero_stage 3"). Each counts once, however many completions it would have had.
  std::map<std::string, std::int64_t> invalid;
  std::vector<std::string> notes;  // what the enumeration decided ("global batch 1536 does not divide ...")

  std::int64_t invalid_total() const;
};

// The cluster as the constraints see it (nodes overridden when constraints.nodes is set).
ClusterProfile constrained_cluster(const ClusterProfile& cluster, const TuneConstraints& constraints);

// Throws SchemaError when the constraints cannot hold on this cluster at all (world size above the
// devices, a fixed world size that does not divide the global batch, a fixed value that does not parse),
// naming the numbers.
Space enumerate_space(const ModelProfile& model, const ClusterProfile& cluster, const TuneConstraints& constraints);

// Precision presets the device supports: "fp32" always, "bf16" and "fp16" when the device lists their
// peak FLOP/s.
std::vector<std::string> supported_precisions(const ClusterProfile& cluster);

}  // namespace zeroplan::tuner
