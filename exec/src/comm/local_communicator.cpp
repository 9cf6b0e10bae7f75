#include <zeroplan/exec/local_communicator.h>

namespace zeroplan::exec {
namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
};

}  // namespace

std::unique_ptr<Work> LocalCommunicator::all_reduce(torch::Tensor& /*tensor*/, ReduceOp /*op*/) {
  return std::make_unique<DoneWork>();  // the sum and the mean of one tensor is itself
}

std::unique_ptr<Work> LocalCommunicator::all_gather(torch::Tensor& output, const torch::Tensor& input) {
  TORCH_CHECK(output.numel() == input.numel(), "all_gather: output has ", output.numel(),
              " elements, expected 1 x ", input.numel());
  if (!output.is_same(input)) output.view({-1}).copy_(input.reshape({-1}));
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Work> LocalCommunicator::reduce_scatter(torch::Tensor& output,
                                                        const torch::Tensor& input, ReduceOp /*op*/) {
  TORCH_CHECK(output.numel() == input.numel(), "reduce_scatter: input has ", input.numel(),
              " elements, expected 1 x ", output.numel());
  if (!output.is_same(input)) output.view({-1}).copy_(input.reshape({-1}));
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Work> LocalCommunicator::broadcast(torch::Tensor& /*tensor*/, int root) {
  TORCH_CHECK(root == 0, "broadcast root ", root, " outside [0, 1)");
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Work> LocalCommunicator::send(const torch::Tensor& tensor, int dst, int tag) {
  if (dst != 0) throw CommError("local communicator of 1 rank cannot send to rank " + std::to_string(dst));
  queued_[tag].push_back(tensor.clone());
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Work> LocalCommunicator::recv(torch::Tensor& tensor, int src, int tag) {
  if (src != 0) throw CommError("local communicator of 1 rank cannot receive from rank " + std::to_string(src));
  auto it = queued_.find(tag);
  if (it == queued_.end() || it->second.empty()) {
    throw CommError("local communicator: recv with tag " + std::to_string(tag) + " before its send (it would wait forever)");
  }
  TORCH_CHECK(it->second.front().numel() == tensor.numel(), "recv: ", tensor.numel(), " elements, the send had ",
              it->second.front().numel());
  tensor.view({-1}).copy_(it->second.front().reshape({-1}));
  it->second.pop_front();
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Communicator> LocalCommunicator::split(int group_size) {
  if (group_size != 1) throw CommError("local communicator of 1 rank cannot form groups of " + std::to_string(group_size));
  return std::make_unique<LocalCommunicator>();
}

}  // namespace zeroplan::exec
