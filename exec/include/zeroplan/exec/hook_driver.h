// The hook driver: the executor's pieces (exec/src/step/pieces.h) driven by a model's own forward and
// backward instead of the step driver's unit loop. A caller that sees the model's units run (Python's
// module and autograd hooks: python/zeroplan/_engine.py) tells the driver where the step is:
//
//   begin_forward(micro)        the model's forward starts (the first microbatch of a step zeroes the
//                               gradients and asks LocalSGD/AdaScale what this step does)
//   before_forward(u) / after_forward(u)     around unit u's forward: parameters gathered, resharded
//   before_backward(u)          unit u's output gradient arrived: its parameters gathered, its offloaded
//                               activations back, the unit before prefetched
//   accumulate(u, slot, g)      a parameter's gradient (autograd's, once per backward) into the unit's
//                               gradient region
//   backward_done(u)            every gradient of unit u is in: the pieces finish it, strictly in reverse
//                               unit order (a unit done early waits for those after it)
//   end_backward()              the backward ended: what is left is finished, the microbatch's reductions
//   step()                      after the last microbatch: the optimizer step on the shards
//
// Parameters live in the units' flat buffers as views (the Python parameters are the same tensors, their
// data replaced), so the model's own code computes with them. The pieces decide everything the plan says;
// this file only orders the calls.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zeroplan/exec/communicator.h"
#include "zeroplan/exec/device.h"
#include "zeroplan/exec/executor.h"
#include "zeroplan/exec/recorder.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/profiles/zoo.h"

namespace zeroplan::exec {

struct HookUnitSpec {
  std::string name;  // "root:pre", "model.layers.0", "root:post"
  std::string type;
  std::vector<std::pair<std::string, torch::Tensor>> params;   // owned, fp32, names relative to the unit
  std::vector<std::pair<std::string, torch::Tensor>> buffers;
  std::vector<zoo::BorrowedParam> borrowed;  // weights of an earlier unit this one uses too (tied)
};

class HookDriver {
 public:
  // Takes over the units' parameters (views of flat buffers, sharded at stage 3). Throws ExecError for a
  // plan this driver cannot run (pipelines and OffloadModel need the step driver's unit chain).
  HookDriver(std::vector<HookUnitSpec> units, const Plan& plan, Communicator& comm, Device& device, Recorder& recorder,
             const ExecOptions& options = {});
  ~HookDriver();
  HookDriver(const HookDriver&) = delete;
  HookDriver& operator=(const HookDriver&) = delete;

  int unit_count() const;
  int microbatches() const;
  bool grads_in_place() const;  // Plan::grads_in_place: add each gradient as autograd makes it
  // The order of unit u's parameters in its flat buffer (accumulate's slot indices).
  std::vector<std::string> param_names(int u) const;
  bool checkpointed(int u) const;  // the plan recomputes unit u in its backward
  torch::ScalarType compute_dtype() const;
  torch::ScalarType param_dtype() const;
  bool autocast() const;

  void begin_forward(int micro, std::int64_t step);
  void before_forward(int u);
  void after_forward(int u);
  // A forward without a backward (evaluation): every unit gathered for it released.
  void end_eval();
  // What the loss is multiplied by before its backward: the loss scale over the ranks whose gradients
  // are summed and the microbatches.
  double backward_scale() const;
  void before_backward(int u);
  void accumulate(int u, int slot, const torch::Tensor& grad);
  void backward_done(int u);
  void end_backward();
  // The optimizer step after the last microbatch; its stats (skipped, loss scale, AdaScale gain).
  StepStats step();

  // Activation offload by ratio: whether on; unit u's forward starts capturing with input `in` (false:
  // not captured; an undefined `in` is found out at end_capture); one saved tensor packed and unpacked
  // through the piece; the forward of u ended with input `in` and output `out` (what the unit keeps
  // anyway).
  bool offload_on() const;
  bool begin_capture(int u, const torch::Tensor& in = {});
  std::shared_ptr<torch::autograd::SavedVariableHooks> pack(const torch::Tensor& t);
  void end_capture(int u, const torch::Tensor& in, const torch::Tensor& out);

  // Every parameter, full, "unit.name" (collective at stage 3); checkpoints as `zeroplan run` writes them.
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters();
  // This rank's share of every parameter, "unit.name" (no communication): the elements of the parameter's
  // flattened form in [offset, offset + values.numel()) that fall in this rank's shard of its unit's flat
  // buffer (the whole parameter where the unit is not sharded, stage 0), in fp32 from the master where
  // the plan keeps one. Every parameter is listed on every rank, with no elements where none are its.
  struct LocalShard {
    std::string name;
    std::vector<std::int64_t> shape;
    std::int64_t offset = 0;
    torch::Tensor values;  // 1-D, a copy on the CPU
  };
  std::vector<LocalShard> local_shards();
  void save_checkpoint(const std::string& dir, std::int64_t step);
  std::int64_t load_checkpoint(const std::string& dir, bool other_run = false);
  bool views_valid() const;

  class Impl;  // hook_driver.cpp

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace zeroplan::exec
