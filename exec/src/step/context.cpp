// The executor's shared state: the units with their flat parameters, shard layouts and borrowed weights.
#include <algorithm>

#include "pieces.h"
#include "strformat.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/exec/executor.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/knobs.h"

namespace zeroplan::exec::pieces {

void check_runnable(const Plan& plan, int world_size) {
  if (auto u = unsupported_features(plan); !u.empty()) {
    std::string list;
    for (const auto& s : u) list += (list.empty() ? "" : ", ") + s;
    throw ExecError("the executor does not run: " + list);
  }
  try {
    validate(plan);
  } catch (const SchemaError& e) {
    throw ExecError(e.what());
  }
  if (plan.world_size != world_size) {
    throw ExecError(detail::format("plan world_size {} != {} ranks running it", plan.world_size, world_size));
  }
  // What the executor does not run although the plan is valid (knobs.h run_rules, `plan --fields`).
  if (std::string why = run_refusal(plan); !why.empty()) throw ExecError(why);
}

void rethrow_unit_error(const Ctx* c, const Device& dev) {
  try {
    throw;
  } catch (const ExecError&) {
    throw;
  } catch (const std::exception& e) {
    const std::string unit = c ? c->cur_unit : "all", phase = c ? c->cur_phase : "setup";
    DeviceRefusal r;
    if (dev.is_out_of_memory(e, &r)) throw OutOfDeviceMemory(unit, phase, r.need_bytes, r.limit_bytes);
    if (dynamic_cast<const c10::Error*>(&e) == nullptr) throw;
    const int mb = c ? c->plan.micro_batch : 0;
    throw UnitFailure(detail::format("unit {}, phase {} (micro batch {}): torch: {}", unit, phase, mb, zoo::torch_cause(e)));
  }
}

Ctx::Ctx(zoo::Model& m, const Plan& p, Communicator& cm, Device& d, Recorder& r, int node_ranks, const StageUnits& stage)
    : model(m), plan(p), comm(cm), dev(d), rec(r), tracker(r), rank(cm.rank()), world(cm.world_size()),
      first_unit(stage.first), input_grad(stage.input_grad), dt(dtypes_of(p)) {
  ranks_per_node = node_ranks > 0 ? node_ranks : world;
  if (world % ranks_per_node != 0) {
    throw ExecError(detail::format("ranks per node {} does not divide the {} ranks", ranks_per_node, world));
  }
  // Stages 1-3 lay every unit out in world equal chunks, one per rank (padded); stage 0 keeps one.
  const int shards = plan.zero_stage >= 1 ? world : 1;
  const int total = static_cast<int>(model.units.size());
  const int count = stage.count < 0 ? total - stage.first : stage.count;
  if (stage.first < 0 || count < 1 || stage.first + count > total) {
    throw ExecError(detail::format("stage units [{}, {}) outside the model's {} units", stage.first, stage.first + count, total));
  }
  units.resize(static_cast<std::size_t>(count));
  std::vector<const c10::TensorImpl*> replicated;  // weights of other stages this stage holds a copy of
  for (std::size_t u = 0; u < units.size(); ++u) {
    const int global = first_unit + static_cast<int>(u);
    const zoo::Unit& src = model.units[static_cast<std::size_t>(global)];
    UnitRT& U = units[u];
    U.name = src.name;
    U.module = src.module;
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& item : src.module->named_parameters(/*recurse=*/true)) named.emplace_back(item.key(), item.value());
    // A weight owned on an earlier stage: this unit's own copy, after its parameters.
    std::vector<std::pair<int, std::string>> tied;
    for (const auto& b : src.borrowed) {
      if (b.owner_unit >= first_unit) continue;
      const auto& owner = model.units[static_cast<std::size_t>(b.owner_unit)];
      const auto owner_params = owner.module->named_parameters(true);
      const torch::Tensor* t = owner_params.find(b.owner_name);
      if (t == nullptr) {
        throw ExecError(detail::format("unit {} borrows {} from unit {}, which has no such parameter", src.name,
                                       b.owner_name, b.owner_unit));
      }
      named.emplace_back("tied." + owner.name + "." + b.owner_name, *t);
      replicated.push_back(t->unsafeGetTensorImpl());
      tied.emplace_back(b.owner_unit, b.owner_name);
    }
    U.flat = FlatParams(named);
    for (const auto& [owner, name] : tied) {
      const ParamSlot* slot = U.flat.find("tied." + model.units[static_cast<std::size_t>(owner)].name + "." + name);
      U.replicas.push_back({owner, name, slot->offset, slot->numel});
    }
    U.layout = make_shard_layout(U.flat.numel(), shards);
    U.base = padded_total;
    U.shard_base = shard_total;
    padded_total += U.layout.padded_numel();
    shard_total += U.layout.shard_numel;
    U.checkpoint = plan.checkpointing.applies_to(global);
    U.pinned = (u == 0);
    for (const auto& b : src.borrowed) {
      if (b.owner_unit < first_unit) continue;  // a replica (above)
      if (b.owner_unit >= global) {
        throw ExecError(detail::format("unit {} borrows from unit {}, which does not come before it", src.name, b.owner_unit));
      }
      const int owner = b.owner_unit - first_unit;
      const ParamSlot* slot = units[static_cast<std::size_t>(owner)].flat.find(b.owner_name);
      if (slot == nullptr) {
        throw ExecError(detail::format("unit {} borrows {} from unit {}, which has no such parameter", src.name,
                                       b.owner_name, b.owner_unit));
      }
      U.borrows.push_back({owner, slot->offset, slot->numel, slot->param});
      units[static_cast<std::size_t>(owner)].pinned = true;
    }
  }
  // The other stages' parameters are not this rank's: released (their modules keep empty tensors).
  if (count < total) {
    torch::NoGradGuard no_grad;
    for (int g = 0; g < total; ++g) {
      if (g >= first_unit && g < first_unit + count) continue;
      for (auto& t : model.units[static_cast<std::size_t>(g)].module->parameters(true)) {
        if (std::find(replicated.begin(), replicated.end(), t.unsafeGetTensorImpl()) != replicated.end()) continue;
        t.set_data(torch::empty({0}, t.options()));
      }
    }
  }
  if (!dt.master) return;
  torch::NoGradGuard no_grad;
  master_init = host_optimizer() ? hzeros(shard_total) : dzeros(shard_total);
  for (const UnitRT& U : units) {
    if (U.numel() == 0) continue;
    torch::Tensor full = torch::zeros({U.layout.padded_numel()});
    U.flat.copy_into(full);
    const std::int64_t begin = U.layout.shard_begin(shards > 1 ? rank : 0);  // stage 0: the one shard
    master_init.narrow(0, U.shard_base, U.shard()).copy_(full.narrow(0, begin, U.shard()));
  }
}

torch::Tensor Ctx::dzeros(std::int64_t n, torch::ScalarType t) const {
  return torch::zeros({n}, torch::TensorOptions().dtype(t).device(dev.torch_device()));
}
torch::Tensor Ctx::dempty(std::int64_t n, torch::ScalarType t) const {
  return torch::empty({n}, torch::TensorOptions().dtype(t).device(dev.torch_device()));
}
torch::Tensor Ctx::hzeros(std::int64_t n, torch::ScalarType t) const { return dev.host_pool().zeros(n, t); }
torch::Tensor Ctx::hempty(std::int64_t n, torch::ScalarType t) const { return dev.host_pool().empty(n, t); }

}  // namespace zeroplan::exec::pieces

namespace zeroplan::exec {

void check_plan_runs(const Plan& plan) {
  pieces::check_runnable(plan, plan.world_size);
}

}  // namespace zeroplan::exec
