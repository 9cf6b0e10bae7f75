#include "zeroplan/tuner/evaluator.h"

#include "zeroplan/tuner/exports.h"

#include "zeroplan/profiles/errors.h"
#include "zeroplan/sim/errors.h"
#include "zeroplan/sim/memory_bound.h"
#include "zeroplan/sim/simulate.h"

namespace zeroplan::tuner {
namespace {

class Simulator final : public Evaluator {
 public:
  Simulator(ModelProfile model, ClusterProfile cluster) : model_(std::move(model)), cluster_(std::move(cluster)) {
    options_.check_cycles = false;  // the lowering builds acyclic graphs; the simulator's tests check it
  }
  Prediction simulate(const Plan& plan) const override { return sim::simulate(model_, cluster_, plan, options_); }
  MemoryBytes memory_lower_bound(const Plan& plan) const override {
    const sim::MemoryBound b = sim::memory_lower_bound(model_, cluster_, plan);
    return {b.device_bytes, b.host_bytes};
  }
  double step_time_lower_bound(const Plan& plan) const override {
    try {
      return sim::step_time_lower_bound(model_, cluster_, plan);
    } catch (const SchemaError&) {
    } catch (const sim::SimError&) {
    }
    return 0.0;
  }

 private:
  ModelProfile model_;
  ClusterProfile cluster_;
  sim::SimOptions options_;
};

class ToolMemory final : public Evaluator {
 public:
  ToolMemory(const Evaluator& inner, std::string tool, const ModelProfile& model)
      : inner_(inner), tool_(std::move(tool)), model_(model) {}
  Prediction simulate(const Plan& plan) const override {
    Prediction p = inner_.simulate(plan);
    add_tool_memory(p, tool_, plan, model_);
    return p;
  }
  MemoryBytes memory_lower_bound(const Plan& plan) const override {
    MemoryBytes b = inner_.memory_lower_bound(plan);
    b.device += tool_device_bytes_beyond_prediction(tool_, plan, model_);
    return b;
  }
  double step_time_lower_bound(const Plan& plan) const override { return inner_.step_time_lower_bound(plan); }

 private:
  const Evaluator& inner_;
  std::string tool_;
  const ModelProfile& model_;
};

}  // namespace

std::unique_ptr<Evaluator> with_tool_memory(const Evaluator& inner, std::string tool, const ModelProfile& model) {
  return std::make_unique<ToolMemory>(inner, std::move(tool), model);
}

std::unique_ptr<Evaluator> make_simulator(const ModelProfile& model, const ClusterProfile& cluster) {
  return std::make_unique<Simulator>(model, cluster);
}

}  // namespace zeroplan::tuner
