// Private to the search space (space.cpp enumerates, space_steps.cpp holds the expansion steps): the
// expander, the Plan's rules placed at their steps, and the steps' shared state.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/knobs.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/tuner/space.h"

namespace zeroplan::tuner::space_detail {

// Returns the reason `p` is invalid after the knob just set, or "" when it is fine so far.
using Rule = std::function<std::string(const Plan&)>;

// The rule an expansion step applies, and the step (its index in step_knobs()).
struct StepRule {
  std::size_t step = 0;
  Rule rule;
};

// Tests: every expansion checks that its setter changed only the knobs step_knobs() lists for its step (the
// rules are applied at the last step that sets a knob they read, from that list).
inline bool g_check_step_knobs = false;
// Throws std::logic_error naming the first knob `after` changed from `before` outside step `step`'s list.
void check_step_knobs(std::size_t step, const Plan& before, const Plan& after);

class Expander {
 public:
  Expander(std::vector<Plan> start, std::map<std::string, std::int64_t>& invalid)
      : plans_(std::move(start)), invalid_(invalid) {}

  // For each plan and each value (a setter), keep the result unless `rule` names a reason.
  template <class T>
  void expand(const std::function<std::vector<T>(const Plan&)>& values, const std::function<void(Plan&, const T&)>& set,
              const StepRule& rule) {
    std::vector<Plan> next;
    next.reserve(plans_.size() * 2);
    for (const Plan& p : plans_) {
      for (const T& v : values(p)) {
        Plan q = p;
        set(q, v);
        if (g_check_step_knobs) check_step_knobs(rule.step, p, q);
        std::string why = rule.rule ? rule.rule(q) : std::string();
        if (why.empty()) next.push_back(std::move(q));
        else ++invalid_[why];
      }
    }
    plans_ = std::move(next);
  }

  std::vector<Plan>& plans() { return plans_; }

 private:
  std::vector<Plan> plans_;
  std::map<std::string, std::int64_t>& invalid_;
};

// The knobs no step sets: each candidate fits them (make_candidates), by their registry names.
const std::vector<std::string>& fitted_knobs();

// The Plan's rules (plan_rules(): validate's own, with its messages) in the search: each is applied at the
// last expansion step that sets a knob it reads, so a partial plan is dropped as soon as it breaks one and
// counted under the message validate throws. Rules that read a knob no step sets are applied at the first
// step; those that read a fitted knob (checkpointing, the activation ratio) are left to each candidate's
// validate at the end. With TuneConstraints::runnable the executor's run rules (knobs.h) join them.
class Rules {
 public:
  // runnable: the executor's run rules too (knobs.h run_rules), counted under "run: <its line>".
  Rules(const std::vector<std::vector<std::string>>& steps, bool runnable) : at_(steps.size()) {
    std::map<std::string, std::size_t> last;
    for (std::size_t i = 0; i < steps.size(); ++i)
      for (const std::string& k : steps[i]) last[k] = i;
    // The last step that sets one of `knobs`; nullopt when one of them is fitted per candidate.
    auto due = [&](const std::vector<std::string>& knobs) -> std::optional<std::size_t> {
      std::size_t step = 0;
      for (const std::string& k : knobs) {
        if (std::find(fitted_knobs().begin(), fitted_knobs().end(), k) != fitted_knobs().end()) return std::nullopt;
        if (const auto it = last.find(k); it != last.end()) step = std::max(step, it->second);
      }
      return step;
    };
    // Each rule of `rules` (plan or run rules: a `knobs` list and `broken`) at its step, its line put in
    // the words the search counts it under by `message`.
    auto add = [&](const auto& rules, auto message) {
      for (const auto& r : rules)
        if (const auto step = due(r.knobs)) at_[*step].push_back([&r, message](const Plan& p) {
            std::string why = r.broken(p);
            return why.empty() ? why : message(why);
          });
    };
    add(plan_rules(), [](const std::string& why) { return plan_rule_message(why); });
    if (runnable) add(run_rules(), [](const std::string& why) { return "run: " + why; });
  }

  // The rule of step `step`: the rules due there, then the step's own search rule (`extra`).
  StepRule at(std::size_t step, Rule extra = {}) const {
    return {step, [rules = at_[step], extra = std::move(extra)](const Plan& p) {
              for (const Rule& r : rules)
                if (std::string why = r(p); !why.empty()) return why;
              return extra ? extra(p) : std::string();
            }};
  }

 private:
  std::vector<std::vector<Rule>> at_;
};

// The expansion steps of enumerate_space, in order, by the registry names of the knobs each sets.
enum Step : std::size_t {
  kPrecision, kZeroStage, kReshard, kPrefetch, kOffloadOptimizer, kOffloadGrads, kOffloadParams, kPipeline, kBatch,
  kOffloadModel, kOffloadModelSlices, kOffloadModelCheckpoint, kOffloadModelMicrobatches, kCheckpointOffload,
  kLocalSgd, kBuckets, kFlatParams, kBroadcastFp16, kFp32ReduceScatter, kAdaScale, kSteps
};
// The registry names of the knobs each step sets, in the steps' order.
const std::vector<std::vector<std::string>>& step_knobs();

std::vector<int> divisors(int n);
std::vector<bool> bools(bool varies, bool base);

struct WorldChoice {
  int world = 1;
  int nodes_used = 1;
};


// One enumeration: the expander and what its steps read. Each expand_* function runs a group of steps, in
// the order of step_knobs().
struct Enumeration {
  Expander& e;
  const Rules& rules;
  const TuneConstraints& c;
  const ClusterProfile& cluster;
  const WorldChoice& w;
  int units;
  const Plan& base;
  Space& s;

  // The steps, in order (space_steps.cpp).
  void expand_sharding();       // precision, ZeRO stage, resharding, prefetch, offload of model states
  void expand_pipeline();       // pipeline stages, schedule and checkpoint mode, then the batch split
  void expand_offload_model();  // fairscale OffloadModel
  void expand_rest();           // checkpoint offload, LocalSGD / SlowMo, buckets, flat params, dtypes, AdaScale
  void make_candidates(const ModelProfile& model);
};
using Set = std::function<void(Plan&, const bool&)>;
using Vals = std::function<std::vector<bool>(const Plan&)>;


}  // namespace zeroplan::tuner::space_detail
