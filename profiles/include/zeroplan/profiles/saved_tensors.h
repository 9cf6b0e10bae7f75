// Saved-tensor hooks from C++: the counterpart of Python's torch.autograd.graph.saved_tensors_hooks.
// Every tensor autograd saves for backward on a thread with an open Scope passes through its Handler's
// hooks (pack in forward, unpack in backward). Installed once per process by replacing the default
// autograd engine with a subclass whose get_default_saved_variable_hooks() asks the thread's handler
// (torch/csrc/autograd/engine.h: set_default_engine_stub); without an open Scope autograd saves as usual.
//
//   saved_tensors::Recorder rec;
//   { saved_tensors::Scope scope(rec); y = unit.forward(x); }
//   auto own = saved_tensors::distinct_storages(rec.saved(), {x, y});   // what the unit alone keeps
#pragma once

#include <torch/csrc/autograd/saved_variable_hooks.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace zeroplan::saved_tensors {

class Handler {
 public:
  virtual ~Handler() = default;
  // The hooks of one saved tensor (called once per tensor autograd saves, before pack).
  virtual std::unique_ptr<torch::autograd::SavedVariableHooks> hooks() = 0;
};

// Routes this thread's saved tensors to `handler` while alive (nests: the previous handler returns).
class Scope {
 public:
  explicit Scope(Handler& handler);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Handler* previous_;
};

// A saved tensor's storage: its identity (valid while the storage lives) and its size in bytes.
struct SavedRef {
  const void* key = nullptr;
  std::int64_t bytes = 0;
  c10::DeviceType device = c10::DeviceType::CPU;
};
SavedRef saved_ref(const torch::Tensor& t);

// Saves every tensor as autograd would (the hooks hold it until autograd lets go) and lists their
// storages in the order saved; holds no tensor itself, so memory is what it is without hooks.
class Recorder final : public Handler {
 public:
  std::unique_ptr<torch::autograd::SavedVariableHooks> hooks() override;
  const std::vector<SavedRef>& saved() const { return saved_; }
  // When set: called with a saved tensor's storage each time autograd unpacks it (in the backward).
  std::function<void(const SavedRef&)> on_unpack;

 private:
  std::vector<SavedRef> saved_;
};

// The distinct storages among `saved` (in the order first saved) on a `device` device that none of `kept`
// shares and that hold at least one byte: what autograd keeps alive for this forward alone, beside the
// unit's input, output, parameters and buffers. Each entry: the index in `saved` of its first tensor.
std::vector<std::size_t> distinct_storages(const std::vector<SavedRef>& saved, const std::vector<torch::Tensor>& kept,
                                           c10::DeviceType device);

}  // namespace zeroplan::saved_tensors
