// Flat parameters: the parameters of one unit back to back in one contiguous 1-D buffer; the module's
// parameters become views of it (set_data keeps each parameter's identity, so modules and tied-weight
// borrowers keep working). Shards split a flat buffer padded to N x ceil(P / N) elements.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zeroplan::exec {

// How P elements split into N equal shards: rank r owns [r*S, (r+1)*S) of the padded buffer.
struct ShardLayout {
  std::int64_t numel = 0;        // P: real elements
  int world = 1;                 // N
  std::int64_t shard_numel = 0;  // S = ceil(P / N)

  std::int64_t padded_numel() const { return shard_numel * world; }
  std::int64_t shard_begin(int rank) const { return shard_numel * rank; }
  // Real (non-padding) elements in rank's shard: between 0 and S.
  std::int64_t shard_valid(int rank) const;
};
// REQUIRES: numel >= 0, world >= 1.
ShardLayout make_shard_layout(std::int64_t numel, int world);

struct ParamSlot {
  std::string name;            // "wte.weight"
  torch::Tensor param;         // the module's parameter (a leaf)
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;     // first element in the flat buffer
  std::int64_t numel = 0;
};

// The parameters of one unit laid out in registration order.
class FlatParams {
 public:
  FlatParams() = default;
  explicit FlatParams(const std::vector<std::pair<std::string, torch::Tensor>>& named);

  std::int64_t numel() const { return numel_; }
  const std::vector<ParamSlot>& slots() const { return slots_; }
  const ParamSlot* find(const std::string& name) const;  // nullptr when absent

  // Copies the parameters' current values into flat[0, numel). REQUIRES: flat 1-D, >= numel elements.
  void copy_into(const torch::Tensor& flat) const;
  // Every parameter becomes the view flat[offset, offset + numel) in its shape.
  void bind(const torch::Tensor& flat);
  // contiguous_params' assert_buffer_is_valid: every parameter's data_ptr is flat's at its offset and
  // it shares flat's storage. False after an out-of-place update replaced a parameter's data.
  bool views_valid(const torch::Tensor& flat) const;

 private:
  std::vector<ParamSlot> slots_;
  std::int64_t numel_ = 0;
};

// FSDP's storage trick: free a flat buffer's memory while its views keep their metadata, and give it
// memory again later (the views see the new memory). Contents after realloc are undefined.
void free_storage(const torch::Tensor& flat);
void realloc_storage(const torch::Tensor& flat);
bool storage_allocated(const torch::Tensor& flat);

}  // namespace zeroplan::exec
