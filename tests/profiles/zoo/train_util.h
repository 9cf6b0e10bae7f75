// Helpers shared by the zoo tests: run a model unit by unit and train it for a few steps.
#pragma once

#include <zeroplan/profiles/errors.h>
#include <zeroplan/profiles/zoo.h>

#include <functional>
#include <string>
#include <vector>

namespace zeroplan::zoo::testing {

// The one line of the SchemaError `f` throws, or "(no SchemaError)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const SchemaError& e) {
    return e.what();
  }
  return "(no SchemaError)";
}

inline torch::Tensor run_units(Model& model, torch::Tensor x) {
  for (Unit& unit : model.units) x = unit.module->forward(x);
  return x;
}

inline std::vector<torch::Tensor> all_parameters(const Model& model) {
  std::vector<torch::Tensor> params;
  for (const Unit& unit : model.units) {
    for (const torch::Tensor& p : unit.module->parameters()) params.push_back(p);
  }
  return params;
}

// Losses of `steps` Adam steps on fresh batches of the model's task.
inline std::vector<double> train_losses(Model& model, int steps, int64_t batch, double lr) {
  torch::optim::Adam optimizer(all_parameters(model), torch::optim::AdamOptions(lr));
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    Batch b = model.task->batch(step, 0, batch);
    optimizer.zero_grad();
    torch::Tensor loss = model.task->loss(run_units(model, b.input), b.target);
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

inline double mean_of_last(const std::vector<double>& values, size_t n) {
  double sum = 0.0;
  for (size_t i = values.size() - n; i < values.size(); ++i) sum += values[i];
  return sum / static_cast<double>(n);
}

inline int64_t unit_parameter_count(const Unit& unit) {
  int64_t total = 0;
  for (const torch::Tensor& p : unit.module->parameters()) total += p.numel();
  return total;
}

// Sample j of a step is the same however the batch is split.
inline void expect_split_invariant(const Task& task, int64_t step, int64_t count, int64_t split) {
  Batch whole = task.batch(step, 0, count);
  Batch first = task.batch(step, 0, split);
  Batch second = task.batch(step, split, count - split);
  EXPECT_TRUE(torch::equal(whole.input, torch::cat({first.input, second.input})));
  EXPECT_TRUE(torch::equal(whole.target, torch::cat({first.target, second.target})));
  Batch other_step = task.batch(step + 1, 0, count);
  EXPECT_FALSE(torch::equal(whole.input, other_step.input));
}

}  // namespace zeroplan::zoo::testing
