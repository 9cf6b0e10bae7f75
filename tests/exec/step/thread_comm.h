// An in-process communicator for unit tests: N ranks as N threads of one process, every collective
// synchronous (done when the call returns) with two barriers, reductions summed in rank order.
#pragma once

#include <barrier>
#include <memory>
#include <vector>

#include "zeroplan/exec/communicator.h"

namespace zeroplan::exec::testing {

class ThreadHub {
 public:
  explicit ThreadHub(int world) : world_(world), barrier_(world), in_(static_cast<std::size_t>(world)) {}
  int world() const { return world_; }

 private:
  friend class ThreadCommunicator;
  int world_;
  std::barrier<> barrier_;
  std::vector<const torch::Tensor*> in_;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadHub& hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return hub_.world(); }
  std::string backend() const override { return "threads"; }

  std::unique_ptr<Work> all_reduce(torch::Tensor& tensor, ReduceOp op) override {
    torch::Tensor sum = exchange(tensor, [&] { return reduce_all(op); });
    tensor.copy_(sum);
    return done();
  }
  std::unique_ptr<Work> all_gather(torch::Tensor& output, const torch::Tensor& input) override {
    torch::Tensor out = exchange(input, [&] {
      std::vector<torch::Tensor> parts;
      for (const auto* t : hub_.in_) parts.push_back(t->reshape({-1}));
      return torch::cat(parts);
    });
    output.view({-1}).copy_(out);
    return done();
  }
  std::unique_ptr<Work> reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) override {
    const std::int64_t n = output.numel();
    torch::Tensor out = exchange(input, [&] {
      torch::Tensor acc = hub_.in_[0]->reshape({-1}).narrow(0, rank_ * n, n).clone();
      for (std::size_t i = 1; i < hub_.in_.size(); ++i) acc.add_(hub_.in_[i]->reshape({-1}).narrow(0, rank_ * n, n));
      if (op == ReduceOp::kAvg) acc.div_(world_size());
      return acc;
    });
    output.view({-1}).copy_(out);
    return done();
  }
  std::unique_ptr<Work> broadcast(torch::Tensor& tensor, int root) override {
    torch::Tensor out = exchange(tensor, [&] { return hub_.in_[static_cast<std::size_t>(root)]->clone(); });
    tensor.copy_(out);
    return done();
  }
  void barrier() override {
    hub_.barrier_.arrive_and_wait();
  }
  std::vector<std::string> fallbacks() const override { return {}; }

 private:
  struct DoneWork final : Work {
    void wait() override {}
  };
  static std::unique_ptr<Work> done() { return std::make_unique<DoneWork>(); }

  // Publish `mine`, compute this rank's result from everyone's inputs, wait until all have read.
  template <typename F>
  torch::Tensor exchange(const torch::Tensor& mine, F&& compute) {
    torch::NoGradGuard no_grad;
    hub_.in_[static_cast<std::size_t>(rank_)] = &mine;
    hub_.barrier_.arrive_and_wait();
    torch::Tensor result = compute();
    hub_.barrier_.arrive_and_wait();
    return result;
  }
  torch::Tensor reduce_all(ReduceOp op) {
    torch::Tensor acc = hub_.in_[0]->clone();
    for (std::size_t i = 1; i < hub_.in_.size(); ++i) acc.add_(*hub_.in_[i]);
    if (op == ReduceOp::kAvg) acc.div_(world_size());
    return acc;
  }

  ThreadHub& hub_;
  int rank_;
};

}  // namespace zeroplan::exec::testing
