#include "zeroplan/tuner/evaluator.h"

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

}  // namespace

std::unique_ptr<Evaluator> make_simulator(const ModelProfile& model, const ClusterProfile& cluster) {
  return std::make_unique<Simulator>(model, cluster);
}

}  // namespace zeroplan::tuner
