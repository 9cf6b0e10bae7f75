// Shared by the communicator tests and their rank helper: each rank's input and a tensor's values.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace zeroplan::exec::commtest {

// Rank r's input of n elements: distinct per rank and per element.
inline torch::Tensor input(int rank, std::int64_t n) {
  return torch::arange(n, torch::kFloat) + 100.0f * static_cast<float>(rank);
}

inline std::vector<float> values(const torch::Tensor& t) {
  auto c = t.contiguous().to(torch::kFloat);
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

}  // namespace zeroplan::exec::commtest
