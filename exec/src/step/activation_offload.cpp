// Activation offload (hfai CPUOffload's offload_ratio), one saved tensor at a time: every tensor autograd
// saves in a unit's forward passes through this piece's hooks (saved_tensors.h). When the forward ends,
// the tensors the unit alone keeps (not its input, output, parameters or buffers; one per storage) are
// offered to the policy (activation_offload.h) in the order saved; the chosen ones are copied to the host
// pool on the device's side lane while the next unit computes, and their device storage is let go when
// that next unit's forward ends (the last two units' when the backward starts: the last unit's forward
// runs on into the loss), the copy waited for then.
// Before unit u's backward its tensors are copied back (if not prefetched already) and the units before
// it prefetched within the byte budget; autograd unpacks views of the restored storage, and frees it as
// it frees saved tensors. Fixed points, so device and host peaks do not depend on the copies' speed.
#include "pieces.h"

#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <algorithm>
#include <unordered_map>

#include "strformat.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/profiles/activation_offload.h"

namespace zeroplan::exec::pieces {

// One storage sent to the host: its bytes on the device until let go, on the host, then back.
struct ActivationOffload::Entry {
  torch::Tensor device;    // the original storage as bytes (until let go), later the restored one
  torch::Tensor host;      // host pool bytes
  std::uint64_t d2h = 0, h2d = 0;
  bool back = false;       // `device` holds the restored bytes
};

// One saved tensor: itself, or (offloaded) how to view its storage once restored.
struct ActivationOffload::Slot {
  torch::Tensor tensor;
  std::shared_ptr<Entry> entry;
  std::vector<std::int64_t> sizes, strides;
  std::int64_t offset = 0;
  torch::ScalarType dtype = torch::kFloat32;
};

namespace {
struct Hook final : torch::autograd::SavedVariableHooks {
  Hook(ActivationOffload& owner, std::vector<std::shared_ptr<ActivationOffload::Slot>>& unit_slots)
      : owner_(owner), unit_slots_(unit_slots) {}
  void call_pack_hook(const torch::Tensor& t) override {
    slot_ = std::make_shared<ActivationOffload::Slot>();
    slot_->tensor = t;
    unit_slots_.push_back(slot_);
  }
  torch::Tensor call_unpack_hook() override { return owner_.unpack(*slot_); }
  ActivationOffload& owner_;
  std::vector<std::shared_ptr<ActivationOffload::Slot>>& unit_slots_;
  std::shared_ptr<ActivationOffload::Slot> slot_;
};
}  // namespace

ActivationOffload::ActivationOffload(Ctx& c)
    : c_(c), ratio_(c.plan.offload.activations_ratio), units_(c.units.size()) {}

ActivationOffload::~ActivationOffload() {
  // Nothing in flight may outlive the piece: wait for the lane's last copy.
  if (last_ticket_ > 0) c_.dev.side_lane().wait(last_ticket_);
}

std::unique_ptr<torch::autograd::SavedVariableHooks> ActivationOffload::hooks() {
  return std::make_unique<Hook>(*this, units_[static_cast<std::size_t>(capturing_)].slots);
}

bool ActivationOffload::begin_capture(int u, bool checkpointed) {
  if (!on()) return false;
  if (u == 0) policy_ = OffloadPolicy(ratio_);  // a new microbatch's forward
  UnitState& s = units_[static_cast<std::size_t>(u)];
  s = UnitState{};
  // A checkpointed unit saves nothing; a pipeline stage's recompute before the backward keeps what it
  // saves on the device.
  if (checkpointed || c_.cur_phase == "recompute") return false;
  s.captured = true;
  capturing_ = u;
  return true;
}

std::optional<saved_tensors::Scope> ActivationOffload::capture(int u, bool checkpointed) {
  if (!begin_capture(u, checkpointed)) return std::nullopt;
  return std::optional<saved_tensors::Scope>(std::in_place, *this);
}

void ActivationOffload::end_forward(int u, const torch::Tensor& in, const torch::Tensor& out) {
  if (!on()) return;
  // The previous unit's copies have had this forward to run: wait for them and let the device go (the
  // last unit's forward runs on into the loss: its predecessor's go when the backward starts).
  if (u > 0 && u + 1 < c_.unit_count()) let_go(u - 1);
  UnitState& s = units_[static_cast<std::size_t>(u)];
  if (!s.captured) return;
  s.captured = false;
  const UnitRT& U = c_.unit(u);
  // What the unit keeps anyway: its input and output, its parameters (the flat buffers) and buffers.
  std::vector<torch::Tensor> kept{in, out, U.full};
  for (const auto& p : U.module->parameters()) kept.push_back(p);
  for (const auto& b : U.module->buffers()) kept.push_back(b);
  for (const auto& b : U.borrows) kept.push_back(b.param);
  std::vector<saved_tensors::SavedRef> refs;
  refs.reserve(s.slots.size());
  for (const auto& slot : s.slots) refs.push_back(saved_tensors::saved_ref(slot->tensor));
  std::unordered_map<const void*, std::shared_ptr<Entry>> chosen;
  for (std::size_t i : saved_tensors::distinct_storages(refs, kept, c_.dev.torch_device().type())) {
    ++s.tensors;
    s.bytes += refs[i].bytes;
    if (!policy_.take(refs[i].bytes)) continue;
    ++s.offloaded;
    s.offloaded_bytes += refs[i].bytes;
    auto e = std::make_shared<Entry>();
    const torch::Tensor& t = s.slots[i]->tensor;
    e->device = torch::empty({0}, t.options().dtype(torch::kUInt8)).set_(t.storage(), 0, {refs[i].bytes}, {1});
    e->host = c_.dev.host_pool().empty(refs[i].bytes, torch::kUInt8);
    e->d2h = last_ticket_ = c_.dev.side_lane().submit(e->host, e->device);
    chosen.emplace(refs[i].key, e);
    s.entries.push_back(e);
  }
  // Every saved tensor of a chosen storage now refers to it through its entry.
  for (std::size_t i = 0; i < s.slots.size(); ++i) {
    auto it = chosen.find(refs[i].key);
    if (it == chosen.end()) continue;
    Slot* slot = s.slots[i].get();
    slot->entry = it->second;
    slot->sizes = slot->tensor.sizes().vec();
    slot->strides = slot->tensor.strides().vec();
    slot->offset = slot->tensor.storage_offset();
    slot->dtype = slot->tensor.scalar_type();
    slot->tensor = torch::Tensor();
  }
  s.slots.clear();  // the hooks hold them from here
}

std::vector<OffloadedActivations> ActivationOffload::summary() const {
  std::vector<OffloadedActivations> out;
  for (int v = 0; v < c_.unit_count(); ++v) {
    const UnitState& s = units_[static_cast<std::size_t>(v)];
    out.push_back({c_.first_unit + v, c_.unit(v).name, s.tensors, s.offloaded, s.bytes, s.offloaded_bytes});
  }
  return out;
}

void ActivationOffload::let_go(int u) {
  UnitState& s = units_[static_cast<std::size_t>(u)];
  if (s.let_go) return;
  s.let_go = true;
  if (s.entries.empty()) return;
  c_.dev.side_lane().wait(s.entries.back()->d2h);
  for (auto& e : s.entries) e->device = torch::Tensor();
}

void ActivationOffload::copy_back(int u) {
  UnitState& s = units_[static_cast<std::size_t>(u)];
  for (auto& e : s.entries) {
    if (e->h2d != 0) continue;
    e->device = torch::empty({e->host.numel()}, torch::TensorOptions().dtype(torch::kUInt8).device(c_.dev.torch_device()));
    e->h2d = last_ticket_ = c_.dev.side_lane().submit(e->device, e->host);
  }
}

void ActivationOffload::before_bwd(int u) {
  if (!on()) return;
  const int n = c_.unit_count();
  if (u == n - 1 || points_.empty()) {  // the backward starts: the last copies done, prefetch plan
    for (int v = 0; v < n; ++v) let_go(v);
    std::vector<std::int64_t> bytes;
    for (const UnitState& s : units_) bytes.push_back(s.offloaded_bytes);
    points_ = prefetch_points(bytes, prefetch_budget(c_.plan.offload.activations_prefetch_bytes, bytes));
  }
  for (int v = u; v >= 0; --v) {
    if (points_[static_cast<std::size_t>(v)] == u) copy_back(v);
  }
  UnitState& s = units_[static_cast<std::size_t>(u)];
  copy_back(u);
  if (!s.entries.empty()) c_.dev.side_lane().wait(s.entries.back()->h2d);
  for (auto& e : s.entries) {
    e->host = torch::Tensor();
    e->back = true;
  }
  s.entries.clear();  // autograd's saved tensors hold the restored storage from here, and free it
}

void ActivationOffload::after_bwd(int u) {
  if (on() && u == 0) points_.clear();
}

torch::Tensor ActivationOffload::unpack(Slot& slot) {
  if (!slot.entry) return slot.tensor;
  Entry& e = *slot.entry;
  if (!e.back) throw ExecError("activation offload: a saved tensor was unpacked before its unit's backward");
  return torch::empty({0}, e.device.options().dtype(slot.dtype)).set_(e.device.storage(), slot.offset, slot.sizes, slot.strides);
}

}  // namespace zeroplan::exec::pieces
