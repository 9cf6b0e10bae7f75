// Activation offload (hfai CPUOffload's offload_ratio), one saved tensor at a time, as
// torch.autograd.graph.save_on_cpu and hfai do it: every tensor autograd saves in a unit's forward passes
// through this piece's hooks (saved_tensors.h). A storage the unit alone keeps (not its input, output,
// parameters or buffers; one per storage) is offered to the policy (activation_offload.h) when it is
// saved; a chosen one is copied to the host pool on the device's side lane when the next one is chosen
// (or the forward ends: the last tensor a unit saves is often its output, kept anyway, then not copied),
// and the piece lets go of its device storage once the copy is done: while the forward saves the next
// ones, the copies in flight stay within the window (offload.activations_prefetch_bytes: -1 or 0, only
// the newest), and when the unit's forward ends all of them (the compute thread waits for the lane there).
// The backward brings each tensor back just before autograd unpacks it: when unit u's backward starts
// its first tensors (in the reverse of the order saved) are copied back within the window (-1: one; 0:
// none ahead, each copied when unpacked), and every unpack copies the next ones; autograd frees the
// restored storage as it frees saved tensors. Fixed points, so device and host peaks do not depend on the
// copies' speed; forward_window and backward_window (activation_offload.h) replay them for the simulator.
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
  const void* key = nullptr;  // the storage's address while the unit's forward runs
  std::int64_t bytes = 0;
  std::uint64_t d2h = 0, h2d = 0;
  int slots = 0, unpacked = 0;  // saved tensors that view it; how many autograd unpacked so far
  bool back = false;            // `device` holds the restored bytes
};

// One saved tensor: itself, or (offloaded) how to view its storage once restored.
struct ActivationOffload::Slot {
  torch::Tensor tensor;
  std::shared_ptr<Entry> entry;
  std::vector<std::int64_t> sizes, strides;
  std::int64_t offset = 0;
  torch::ScalarType dtype = torch::kFloat32;
};

// A storage this unit's forward saved before: what was decided for it. The weak reference keeps the
// address from being reused by a new storage while the unit's forward runs.
struct ActivationOffload::Seen {
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> storage;
  std::int64_t bytes = 0;
  std::shared_ptr<Entry> entry;  // null: stays on the device
};

namespace {
struct Hook final : torch::autograd::SavedVariableHooks {
  explicit Hook(ActivationOffload& owner) : owner_(owner) {}
  void call_pack_hook(const torch::Tensor& t) override { slot_ = owner_.pack(t); }
  torch::Tensor call_unpack_hook() override { return owner_.unpack(*slot_); }
  ActivationOffload& owner_;
  std::shared_ptr<ActivationOffload::Slot> slot_;
};

// What unit U keeps on the device anyway: its input and output (undefined when not known yet), its
// flat parameters, parameters, buffers and borrowed weights.
std::vector<torch::Tensor> kept_tensors(const UnitRT& U, const torch::Tensor& in, const torch::Tensor& out) {
  std::vector<torch::Tensor> kept{in, out, U.full};
  for (const auto& p : U.module->parameters()) kept.push_back(p);
  for (const auto& b : U.module->buffers()) kept.push_back(b);
  for (const auto& b : U.borrows) kept.push_back(b.param);
  return kept;
}
}  // namespace

ActivationOffload::ActivationOffload(Ctx& c)
    : c_(c), ratio_(c.plan.offload.activations_ratio), units_(c.units.size()) {}

ActivationOffload::~ActivationOffload() {
  // Nothing in flight may outlive the piece: wait for the lane's last copy.
  if (last_ticket_ > 0) c_.dev.side_lane().wait(last_ticket_);
}

std::unique_ptr<torch::autograd::SavedVariableHooks> ActivationOffload::hooks() { return std::make_unique<Hook>(*this); }

bool ActivationOffload::begin_capture(int u, bool checkpointed, const torch::Tensor& in) {
  if (!on()) return false;
  if (u == 0) policy_ = OffloadPolicy(ratio_);  // a new microbatch's forward
  UnitState& s = units_[static_cast<std::size_t>(u)];
  s = UnitState{};
  // A checkpointed unit saves nothing; a pipeline stage's recompute before the backward keeps what it
  // saves on the device.
  if (checkpointed || c_.cur_phase == "recompute") return false;
  s.captured = true;
  capturing_ = u;
  // What the unit keeps anyway, known before its forward: its input, parameters (the flat buffers) and
  // buffers (the output is taken back when the forward ends).
  kept_.clear();
  for (const torch::Tensor& t : kept_tensors(c_.unit(u), in, {})) kept_.insert(saved_tensors::saved_ref(t).key);
  return true;
}

std::optional<saved_tensors::Scope> ActivationOffload::capture(int u, bool checkpointed, const torch::Tensor& in) {
  if (!begin_capture(u, checkpointed, in)) return std::nullopt;
  return std::optional<saved_tensors::Scope>(std::in_place, *this);
}

std::shared_ptr<ActivationOffload::Slot> ActivationOffload::pack(const torch::Tensor& t) {
  auto slot = std::make_shared<Slot>();
  slot->tensor = t;
  UnitState& s = units_[static_cast<std::size_t>(capturing_)];
  const saved_tensors::SavedRef ref = saved_tensors::saved_ref(t);
  if (!s.captured || ref.key == nullptr || ref.bytes <= 0 || ref.device != c_.dev.torch_device().type() ||
      kept_.count(ref.key) != 0)
    return slot;
  auto [it, fresh] = s.seen.try_emplace(ref.key);
  if (fresh) {
    it->second = Seen{t.storage().getWeakStorageImpl(), ref.bytes, nullptr};
    ++s.tensors;
    s.bytes += ref.bytes;
    if (policy_.take(ref.bytes)) {
      ++s.offloaded;
      s.offloaded_bytes += ref.bytes;
      auto e = std::make_shared<Entry>();
      e->key = ref.key;
      e->bytes = ref.bytes;
      e->device = torch::empty({0}, t.options().dtype(torch::kUInt8)).set_(t.storage(), 0, {ref.bytes}, {1});
      it->second.entry = e;
      s.entries.push_back(e);
      // The one chosen before goes out now; this one waits for the next (or the forward's end): the last
      // tensor a unit saves is often its output, which stays anyway and is not copied then.
      send_pending();
      pending_ = e;
    }
  }
  const std::shared_ptr<Entry>& e = it->second.entry;
  if (!e) return slot;
  ++e->slots;
  slot->entry = e;
  slot->sizes = t.sizes().vec();
  slot->strides = t.strides().vec();
  slot->offset = t.storage_offset();
  slot->dtype = t.scalar_type();
  slot->tensor = torch::Tensor();
  s.slots.push_back(slot);
  return slot;
}

void ActivationOffload::send_pending() {
  if (!pending_) return;
  std::shared_ptr<Entry> e = std::move(pending_);
  e->host = c_.dev.host_pool().empty(e->bytes, torch::kUInt8);
  e->d2h = last_ticket_ = c_.dev.side_lane().submit(e->host, e->device, CopyDirection::d2h);
  in_flight_bytes_ += e->bytes;
  in_flight_.push_back(std::move(e));
  // The window: the older copies in flight are waited for and their device storage let go.
  while (let_oldest_go(in_flight_.size(), in_flight_bytes_, c_.plan.offload.activations_prefetch_bytes)) release_oldest();
}

void ActivationOffload::release_oldest() {
  std::shared_ptr<Entry> e = std::move(in_flight_.front());
  in_flight_.pop_front();
  in_flight_bytes_ -= e->bytes;
  c_.dev.side_lane().wait(e->d2h);
  e->device = torch::Tensor();
}

void ActivationOffload::end_forward(int u, const torch::Tensor& in, const torch::Tensor& out) {
  if (!on()) return;
  UnitState& s = units_[static_cast<std::size_t>(u)];
  if (!s.captured) return;
  s.captured = false;
  // A storage offloaded that the unit keeps anyway (its output; its input, parameters or buffers where
  // the driver could not name them before the forward) stays on the device: its saved tensors view the
  // kept tensor again, the host copy and the policy's count go. (Keys are storage addresses: the weak
  // references in `seen` keep them unique until here.)
  std::unordered_map<const void*, torch::Tensor> kept;
  for (const torch::Tensor& t : kept_tensors(c_.unit(u), in, out)) kept.emplace(saved_tensors::saved_ref(t).key, t);
  kept.erase(nullptr);
  // Offered to the policy and not taken: as if never offered too.
  for (const auto& [key, t] : kept) {
    auto seen = s.seen.find(key);
    if (seen == s.seen.end() || seen->second.entry) continue;
    --s.tensors;
    s.bytes -= seen->second.bytes;
    policy_.forget(seen->second.bytes, false);
  }
  std::unordered_map<const Entry*, const torch::Tensor*> cancelled;
  std::vector<std::shared_ptr<Entry>> sent;
  for (auto& e : s.entries) {
    auto it = kept.find(e->key);
    if (it == kept.end()) {
      sent.push_back(e);
      continue;
    }
    cancelled.emplace(e.get(), &it->second);
    --s.tensors;
    s.bytes -= e->bytes;
    --s.offloaded;
    s.offloaded_bytes -= e->bytes;
    policy_.forget(e->bytes, true);
  }
  for (const auto& slot : s.slots) {
    auto it = cancelled.find(slot->entry.get());
    if (it == cancelled.end()) continue;
    const torch::Tensor& owner = *it->second;
    slot->tensor = torch::empty({0}, owner.options().dtype(slot->dtype)).set_(owner.storage(), slot->offset, slot->sizes, slot->strides);
    slot->entry = nullptr;
  }
  // The last one chosen goes out (unless kept after all), and the unit's copies are done and their device
  // storage let go before the next unit's forward.
  if (pending_ && cancelled.count(pending_.get()) != 0) pending_ = nullptr;
  send_pending();
  while (!in_flight_.empty()) release_oldest();
  s.entries = std::move(sent);
  s.slots.clear();  // the hooks hold them from here
  s.seen.clear();
}

std::vector<OffloadedActivations> ActivationOffload::summary() const {
  std::vector<OffloadedActivations> out;
  for (int v = 0; v < c_.unit_count(); ++v) {
    const UnitState& s = units_[static_cast<std::size_t>(v)];
    out.push_back({c_.first_unit + v, c_.unit(v).name, s.tensors, s.offloaded, s.bytes, s.offloaded_bytes});
  }
  return out;
}

void ActivationOffload::copy_back(Entry& e) {
  if (e.h2d != 0) return;
  e.device = torch::empty({e.bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(c_.dev.torch_device()));
  e.h2d = last_ticket_ = c_.dev.side_lane().submit(e.device, e.host, CopyDirection::h2d);
}

// The next tensors of the unit restoring, in the order needed, copied back while the bytes ahead of
// need stay within the window (-1: one tensor ahead).
void ActivationOffload::issue_ahead() {
  if (restoring_ < 0) return;
  UnitState& s = units_[static_cast<std::size_t>(restoring_)];
  while (s.next >= 0) {
    Entry& e = *s.entries[static_cast<std::size_t>(s.next)];
    if (e.h2d != 0) {
      --s.next;
      continue;
    }
    if (!copy_back_ahead(ahead_bytes_, e.bytes, c_.plan.offload.activations_prefetch_bytes)) break;
    copy_back(e);
    ahead_bytes_ += e.bytes;
    --s.next;
  }
}

void ActivationOffload::before_bwd(int u) {
  if (!on()) return;
  UnitState& s = units_[static_cast<std::size_t>(u)];
  restoring_ = u;
  ahead_bytes_ = 0;
  s.next = static_cast<int>(s.entries.size()) - 1;  // needed last saved first
  issue_ahead();
}

void ActivationOffload::after_bwd(int u) {
  if (!on()) return;
  // What autograd never unpacked (a saved tensor no gradient needed) goes with the unit's backward, once
  // a copy back in flight is done.
  UnitState& s = units_[static_cast<std::size_t>(u)];
  for (auto& e : s.entries)
    if (e->h2d != 0 && !e->back) c_.dev.side_lane().wait(e->h2d);
  s.entries.clear();
  restoring_ = -1;
  ahead_bytes_ = 0;
}

torch::Tensor ActivationOffload::unpack(Slot& slot) {
  if (!slot.entry) return slot.tensor;
  Entry& e = *slot.entry;
  if (!e.back) {
    if (!e.host.defined()) throw ExecError("activation offload: a saved tensor was unpacked after its storage was let go");
    const bool ahead = e.h2d != 0;
    copy_back(e);  // not copied ahead (out of the expected order): now
    c_.dev.side_lane().wait(e.h2d);
    if (ahead) ahead_bytes_ -= e.bytes;
    e.back = true;
    e.host = torch::Tensor();
    issue_ahead();
  }
  // The slot holds its view from here (autograd frees it with the saved tensor); the entry lets go of the
  // restored storage once every slot took its view.
  slot.tensor = torch::empty({0}, e.device.options().dtype(slot.dtype)).set_(e.device.storage(), slot.offset, slot.sizes, slot.strides);
  std::shared_ptr<Entry> keep = std::move(slot.entry);
  if (++e.unpacked == e.slots) e.device = torch::Tensor();
  return slot.tensor;
}

}  // namespace zeroplan::exec::pieces
