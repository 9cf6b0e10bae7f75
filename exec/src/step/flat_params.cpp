#include "zeroplan/exec/flat_params.h"

#include <algorithm>

namespace zeroplan::exec {

std::int64_t ShardLayout::shard_valid(int rank) const {
  return std::clamp<std::int64_t>(numel - shard_begin(rank), 0, shard_numel);
}

ShardLayout make_shard_layout(std::int64_t numel, int world) {
  TORCH_INTERNAL_ASSERT(numel >= 0 && world >= 1);
  ShardLayout l;
  l.numel = numel;
  l.world = world;
  l.shard_numel = (numel + world - 1) / world;
  return l;
}

FlatParams::FlatParams(const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  for (const auto& [name, p] : named) {
    TORCH_INTERNAL_ASSERT(p.scalar_type() == torch::kFloat32, "flat parameters are fp32; ", name, " is ",
                          p.scalar_type());
    ParamSlot s;
    s.name = name;
    s.param = p;
    s.shape = p.sizes().vec();
    s.offset = numel_;
    s.numel = p.numel();
    numel_ += s.numel;
    slots_.push_back(std::move(s));
  }
}

const ParamSlot* FlatParams::find(const std::string& name) const {
  for (const auto& s : slots_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

void FlatParams::copy_into(const torch::Tensor& flat) const {
  TORCH_INTERNAL_ASSERT(flat.dim() == 1 && flat.numel() >= numel_);
  torch::NoGradGuard no_grad;
  for (const auto& s : slots_) {
    flat.narrow(0, s.offset, s.numel).copy_(s.param.detach().reshape({-1}));
  }
}

void FlatParams::bind(const torch::Tensor& flat) {
  TORCH_INTERNAL_ASSERT(flat.dim() == 1 && flat.numel() >= numel_ && flat.is_contiguous());
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    s.param.set_data(flat.narrow(0, s.offset, s.numel).view(s.shape));
  }
}

bool FlatParams::views_valid(const torch::Tensor& flat) const {
  const auto* base = static_cast<const char*>(flat.data_ptr());
  for (const auto& s : slots_) {
    if (!s.param.defined() || !s.param.storage().is_alias_of(flat.storage())) return false;
    if (s.param.sizes().vec() != s.shape || !s.param.is_contiguous()) return false;
    if (static_cast<const char*>(s.param.data_ptr()) != base + s.offset * static_cast<std::int64_t>(flat.element_size())) {
      return false;
    }
  }
  return true;
}

void free_storage(const torch::Tensor& flat) {
  c10::StorageImpl* impl = flat.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, flat.device()));
  impl->set_nbytes(0);
}

void realloc_storage(const torch::Tensor& flat) {
  c10::StorageImpl* impl = flat.storage().unsafeGetStorageImpl();
  const std::size_t nbytes = static_cast<std::size_t>((flat.storage_offset() + flat.numel()) * flat.element_size());
  if (impl->nbytes() == nbytes) return;
  TORCH_INTERNAL_ASSERT(impl->allocator() != nullptr, "flat buffer without an allocator");
  impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));
  impl->set_nbytes(nbytes);
}

bool storage_allocated(const torch::Tensor& flat) { return flat.storage().nbytes() > 0; }

}  // namespace zeroplan::exec
