#include <zeroplan/exec/counting_communicator.h>

#include <thread>

namespace zeroplan::exec {

const char* to_string(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kBarrier: return "barrier";
    case Collective::kSend: return "send";
    case Collective::kRecv: return "recv";
  }
  return "?";
}

CountingCommunicator::CountingCommunicator(std::unique_ptr<Communicator> inner,
                                           std::chrono::microseconds delay)
    : owned_(std::move(inner)), inner_(owned_.get()), delay_(delay) {
  TORCH_CHECK(inner_ != nullptr, "CountingCommunicator needs a communicator to wrap");
}

CountingCommunicator::CountingCommunicator(Communicator& inner, std::chrono::microseconds delay)
    : inner_(&inner), delay_(delay) {}

void CountingCommunicator::set_delay(std::chrono::microseconds delay) {
  std::lock_guard<std::mutex> lock(mutex_);
  delay_ = delay;
}

CollectiveCounts CountingCommunicator::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  CollectiveCounts c;
  for (const auto& call : calls_) {
    switch (call.kind) {
      case Collective::kAllReduce: ++c.all_reduce; c.bytes_all_reduce += call.bytes; break;
      case Collective::kAllGather: ++c.all_gather; c.bytes_all_gather += call.bytes; break;
      case Collective::kReduceScatter: ++c.reduce_scatter; c.bytes_reduce_scatter += call.bytes; break;
      case Collective::kBroadcast: ++c.broadcast; c.bytes_broadcast += call.bytes; break;
      case Collective::kBarrier: ++c.barrier; break;
      case Collective::kSend: ++c.send; c.bytes_send += call.bytes; break;
      case Collective::kRecv: ++c.recv; c.bytes_recv += call.bytes; break;
    }
  }
  return c;
}

std::vector<CollectiveCall> CountingCommunicator::calls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_;
}

void CountingCommunicator::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  calls_.clear();
}

void CountingCommunicator::record(Collective kind, int64_t bytes) {
  std::chrono::microseconds delay;
  {
    std::lock_guard<std::mutex> lock(sink_->mutex_);
    sink_->calls_.push_back({kind, bytes});
    delay = sink_->delay_;
  }
  if (delay.count() > 0) std::this_thread::sleep_for(delay);
}

std::unique_ptr<Work> CountingCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  record(Collective::kAllReduce, static_cast<int64_t>(tensor.nbytes()));
  return inner_->all_reduce(tensor, op);
}

std::unique_ptr<Work> CountingCommunicator::all_gather(torch::Tensor& output,
                                                       const torch::Tensor& input) {
  record(Collective::kAllGather, static_cast<int64_t>(output.nbytes()));
  return inner_->all_gather(output, input);
}

std::unique_ptr<Work> CountingCommunicator::reduce_scatter(torch::Tensor& output,
                                                           const torch::Tensor& input, ReduceOp op) {
  record(Collective::kReduceScatter, static_cast<int64_t>(input.nbytes()));
  return inner_->reduce_scatter(output, input, op);
}

std::unique_ptr<Work> CountingCommunicator::broadcast(torch::Tensor& tensor, int root) {
  record(Collective::kBroadcast, static_cast<int64_t>(tensor.nbytes()));
  return inner_->broadcast(tensor, root);
}

void CountingCommunicator::barrier() {
  record(Collective::kBarrier, 0);
  inner_->barrier();
}

std::unique_ptr<Work> CountingCommunicator::send(const torch::Tensor& tensor, int dst, int tag) {
  record(Collective::kSend, static_cast<int64_t>(tensor.nbytes()));
  return inner_->send(tensor, dst, tag);
}

std::unique_ptr<Work> CountingCommunicator::recv(torch::Tensor& tensor, int src, int tag) {
  record(Collective::kRecv, static_cast<int64_t>(tensor.nbytes()));
  return inner_->recv(tensor, src, tag);
}

std::unique_ptr<Communicator> CountingCommunicator::split(int group_size) {
  std::chrono::microseconds delay;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    delay = delay_;
  }
  return std::make_unique<CountingCommunicator>(inner_->split(group_size), delay);
}

std::unique_ptr<Communicator> CountingCommunicator::duplicate() {
  auto d = std::make_unique<CountingCommunicator>(inner_->duplicate());
  d->sink_ = sink_;
  return d;
}

}  // namespace zeroplan::exec
