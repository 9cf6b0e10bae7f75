// Saved-tensor hooks through an autograd engine subclass (see saved_tensors.h).
#include "zeroplan/profiles/saved_tensors.h"

#include <torch/csrc/autograd/engine.h>

#include <mutex>
#include <unordered_set>

namespace zeroplan::saved_tensors {

namespace {

thread_local Handler* t_handler = nullptr;
// The engine this one replaced: in a Python process torch's PythonEngine, whose default hooks are
// Python's saved_tensors_hooks (torch.utils.checkpoint, save_on_cpu); they keep working outside a Scope.
torch::autograd::Engine* g_previous = nullptr;

// The base engine with one change: the default saved-variable hooks are the thread's handler's, else
// those of the engine it replaced. The engine's threads and queues are the base class's.
struct HookEngine final : torch::autograd::Engine {
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (t_handler != nullptr) return t_handler->hooks();
    return g_previous != nullptr ? g_previous->get_default_saved_variable_hooks() : nullptr;
  }
};

torch::autograd::Engine& hook_engine() {
  // Never destroyed: autograd may still run while static objects are torn down at exit.
  static HookEngine* engine = [] {
    auto* e = new HookEngine();
    // Its per-device threads now (a CUDA process has initialised CUDA by the time it records saved
    // tensors): see cuda_init() in profiler/cuda.cpp.
    e->initialize_device_threads_pool();
    return e;
  }();
  return *engine;
}

void install_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_previous = &torch::autograd::Engine::get_default_engine();
    torch::autograd::set_default_engine_stub(&hook_engine);
  });
}

struct KeepHook final : torch::autograd::SavedVariableHooks {
  KeepHook(std::vector<SavedRef>& out, const std::function<void(const SavedRef&)>& on_unpack)
      : out_(out), on_unpack_(on_unpack) {}
  void call_pack_hook(const torch::Tensor& t) override {
    t_ = t;
    ref_ = saved_ref(t);
    out_.push_back(ref_);
  }
  torch::Tensor call_unpack_hook() override {
    if (on_unpack_) on_unpack_(ref_);
    return t_;
  }
  std::vector<SavedRef>& out_;
  const std::function<void(const SavedRef&)>& on_unpack_;
  torch::Tensor t_;
  SavedRef ref_;
};

}  // namespace

Scope::Scope(Handler& handler) : previous_(t_handler) {
  install_once();
  t_handler = &handler;
}
Scope::~Scope() { t_handler = previous_; }

std::unique_ptr<torch::autograd::SavedVariableHooks> Recorder::hooks() { return std::make_unique<KeepHook>(saved_, on_unpack); }

SavedRef saved_ref(const torch::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return {};
  return {static_cast<const void*>(t.storage().unsafeGetStorageImpl()), static_cast<std::int64_t>(t.storage().nbytes()),
          t.device().type()};
}

std::vector<std::size_t> distinct_storages(const std::vector<SavedRef>& saved, const std::vector<torch::Tensor>& kept,
                                           c10::DeviceType device) {
  std::unordered_set<const void*> seen;
  for (const auto& k : kept) seen.insert(saved_ref(k).key);
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < saved.size(); ++i) {
    if (saved[i].key == nullptr || saved[i].bytes <= 0 || saved[i].device != device) continue;
    if (!seen.insert(saved[i].key).second) continue;
    out.push_back(i);
  }
  return out;
}

}  // namespace zeroplan::saved_tensors
