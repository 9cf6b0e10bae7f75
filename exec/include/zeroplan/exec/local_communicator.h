// A communicator for a world of one rank: every collective is a local copy or nothing, done at once.
// The single-process reference runs through it, so it takes the same code path as a multi-rank run.
#pragma once

#include <zeroplan/exec/communicator.h>

#include <deque>
#include <map>

namespace zeroplan::exec {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "local"; }
  std::unique_ptr<Work> all_reduce(torch::Tensor& tensor, ReduceOp op) override;
  std::unique_ptr<Work> all_gather(torch::Tensor& output, const torch::Tensor& input) override;
  std::unique_ptr<Work> reduce_scatter(torch::Tensor& output, const torch::Tensor& input,
                                       ReduceOp op) override;
  std::unique_ptr<Work> broadcast(torch::Tensor& tensor, int root) override;
  void barrier() override {}
  std::unique_ptr<Communicator> split(int group_size) override;
  std::unique_ptr<Communicator> duplicate() override { return split(1); }
  // To itself (rank 0): a send is copied and queued per tag, the recv with that tag takes it.
  std::unique_ptr<Work> send(const torch::Tensor& tensor, int dst, int tag) override;
  std::unique_ptr<Work> recv(torch::Tensor& tensor, int src, int tag) override;
  std::vector<std::string> fallbacks() const override { return {}; }

 private:
  std::map<int, std::deque<torch::Tensor>> queued_;
};

}  // namespace zeroplan::exec
