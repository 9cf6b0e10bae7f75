// The executor's shared state: the units with their flat parameters, shard layouts and borrowed weights.
#include "pieces.h"
#include "strformat.h"
#include "zeroplan/exec/exec_errors.h"

namespace zeroplan::exec::pieces {

Ctx::Ctx(zoo::Model& m, const Plan& p, Communicator& cm, Device& d, Recorder& r, int node_ranks)
    : model(m), plan(p), comm(cm), dev(d), rec(r), tracker(r), rank(cm.rank()), world(cm.world_size()),
      dt(dtypes_of(p)) {
  ranks_per_node = node_ranks > 0 ? node_ranks : world;
  if (world % ranks_per_node != 0) {
    throw ExecError(detail::format("ranks per node {} does not divide the {} ranks", ranks_per_node, world));
  }
  // Stages 1-3 lay every unit out in world equal chunks, one per rank (padded); stage 0 keeps one.
  const int shards = plan.zero_stage >= 1 ? world : 1;
  units.resize(model.units.size());
  for (std::size_t u = 0; u < model.units.size(); ++u) {
    const zoo::Unit& src = model.units[u];
    UnitRT& U = units[u];
    U.name = src.name;
    U.module = src.module;
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& item : src.module->named_parameters(/*recurse=*/true)) named.emplace_back(item.key(), item.value());
    U.flat = FlatParams(named);
    U.layout = make_shard_layout(U.flat.numel(), shards);
    U.base = padded_total;
    U.shard_base = shard_total;
    padded_total += U.layout.padded_numel();
    shard_total += U.layout.shard_numel;
    U.checkpoint = plan.checkpointing.applies_to(static_cast<int>(u));
    U.pinned = (u == 0);
    for (const auto& b : src.borrowed) {
      if (b.owner_unit < 0 || b.owner_unit >= static_cast<int>(u)) {
        throw ExecError(detail::format("unit {} borrows from unit {}, which does not come before it", src.name, b.owner_unit));
      }
      const ParamSlot* slot = units[static_cast<std::size_t>(b.owner_unit)].flat.find(b.owner_name);
      if (slot == nullptr) {
        throw ExecError(detail::format("unit {} borrows {} from unit {}, which has no such parameter", src.name,
                                       b.owner_name, b.owner_unit));
      }
      U.borrows.push_back({b.owner_unit, slot->offset, slot->numel, slot->param});
      units[static_cast<std::size_t>(b.owner_unit)].pinned = true;
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

}  // namespace zeroplan::exec::pieces
