// A decorator for tests and measurements: counts every collective and its bytes, and can sleep
// before each one (to shake out ordering bugs and to emulate a slow link). Bytes follow nccl-tests'
// "size": the full buffer (all_reduce: the tensor; all_gather: the output; reduce_scatter: the input;
// broadcast: the tensor).
#pragma once

#include <zeroplan/exec/communicator.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace zeroplan::exec {

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kBarrier, kSend, kRecv };
const char* to_string(Collective c);

struct CollectiveCall {
  Collective kind;
  int64_t bytes = 0;
};

struct CollectiveCounts {
  int64_t all_reduce = 0, all_gather = 0, reduce_scatter = 0, broadcast = 0, barrier = 0;
  int64_t bytes_all_reduce = 0, bytes_all_gather = 0, bytes_reduce_scatter = 0, bytes_broadcast = 0;
  // Point to point (pipelines): not in calls() or bytes(), which count collectives.
  int64_t send = 0, recv = 0, bytes_send = 0, bytes_recv = 0;
  int64_t calls() const { return all_reduce + all_gather + reduce_scatter + broadcast + barrier; }
  int64_t bytes() const {
    return bytes_all_reduce + bytes_all_gather + bytes_reduce_scatter + bytes_broadcast;
  }
};

class CountingCommunicator final : public Communicator {
 public:
  // Owns `inner`.
  explicit CountingCommunicator(std::unique_ptr<Communicator> inner,
                                std::chrono::microseconds delay = {});
  // Borrows `inner`, which must outlive this object.
  explicit CountingCommunicator(Communicator& inner, std::chrono::microseconds delay = {});

  // Sleep this long before issuing each collective (0: none).
  void set_delay(std::chrono::microseconds delay);
  CollectiveCounts counts() const;
  std::vector<CollectiveCall> calls() const;  // in issue order
  void reset();

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend(); }
  std::unique_ptr<Work> all_reduce(torch::Tensor& tensor, ReduceOp op) override;
  std::unique_ptr<Work> all_gather(torch::Tensor& output, const torch::Tensor& input) override;
  std::unique_ptr<Work> reduce_scatter(torch::Tensor& output, const torch::Tensor& input,
                                       ReduceOp op) override;
  std::unique_ptr<Work> broadcast(torch::Tensor& tensor, int root) override;
  void barrier() override;
  std::unique_ptr<Work> send(const torch::Tensor& tensor, int dst, int tag) override;
  std::unique_ptr<Work> recv(torch::Tensor& tensor, int src, int tag) override;
  // Counts its own calls (the group's), with the same delay.
  std::unique_ptr<Communicator> split(int group_size) override;
  // Its calls are counted here, with this one's (they are the same ranks' collectives).
  std::unique_ptr<Communicator> duplicate() override;
  std::vector<std::string> fallbacks() const override { return inner_->fallbacks(); }
  std::int64_t ring_bytes_sent() const override { return inner_->ring_bytes_sent(); }

 private:
  void record(Collective kind, int64_t bytes);

  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
  CountingCommunicator* sink_ = this;  // where calls are recorded (a duplicate's: its parent's)
  mutable std::mutex mutex_;
  std::chrono::microseconds delay_;
  std::vector<CollectiveCall> calls_;
};

}  // namespace zeroplan::exec
