// The communicator: the executor's only door to other ranks. The c10d implementation (Gloo on CPU,
// NCCL on CUDA) sits behind it, and tests wrap it to count collectives or inject delays and faults.
//
// Semantics follow c10d: every call is collective (all ranks call it in the same order) and returns a
// Work handle; wait() blocks until this rank's part is done and throws CommError on failure or
// timeout. Buffers must stay alive and unmodified until wait() returns.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>

#include "zeroplan/profiles/errors.h"
#include <string>
#include <vector>

namespace zeroplan::exec {

// A peer died, timed out or a collective failed. what() is one line naming the rank when known.
class CommError : public Error {
 public:
  explicit CommError(const std::string& message) : Error(ErrorKind::run_failed, message) {}
};

enum class ReduceOp { kSum, kAvg };

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;  // "gloo", "nccl", "local"

  // In place on `tensor`.
  virtual std::unique_ptr<Work> all_reduce(torch::Tensor& tensor, ReduceOp op) = 0;
  // output has world_size x input.numel() elements; rank r's input lands at [r*n, (r+1)*n).
  virtual std::unique_ptr<Work> all_gather(torch::Tensor& output, const torch::Tensor& input) = 0;
  // input has world_size x output.numel() elements; this rank receives the reduction of its chunk.
  virtual std::unique_ptr<Work> reduce_scatter(torch::Tensor& output, const torch::Tensor& input,
                                               ReduceOp op) = 0;
  virtual std::unique_ptr<Work> broadcast(torch::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;
  // A communicator over this rank's block of `group_size` consecutive ranks (the ranks r with
  // r / group_size == rank() / group_size): the ranks of one node, numbered node by node as torchrun
  // numbers them. Collective: every rank calls it with the same group_size, which divides world_size().
  // Throws CommError when this communicator cannot form groups.
  virtual std::unique_ptr<Communicator> split(int group_size) {
    throw CommError(backend() + " communicator cannot form groups of " + std::to_string(group_size) + " ranks");
  }

  // A second communicator over the same ranks with its own process group (its own Gloo worker thread,
  // its own NCCL stream), so its collectives do not queue behind this one's: FSDP's separate
  // reduce-scatter stream. Collective: every rank calls it, in the same order as the other collectives.
  // Throws CommError when this communicator cannot.
  virtual std::unique_ptr<Communicator> duplicate() {
    throw CommError(backend() + " communicator cannot form a second process group");
  }

  // Point to point (pipeline stages): `tensor` goes to rank `dst` of this communicator, which receives it
  // with recv(t, this rank, tag) into a tensor of the same numel and dtype. Not collective: only the two
  // ranks call. Sends and receives between two ranks with the same tag match in the order issued.
  // Throws CommError when this communicator cannot.
  virtual std::unique_ptr<Work> send(const torch::Tensor& tensor, int dst, int tag) {
    (void)tensor;
    (void)tag;
    throw CommError(backend() + " communicator cannot send to rank " + std::to_string(dst));
  }
  virtual std::unique_ptr<Work> recv(torch::Tensor& tensor, int src, int tag) {
    (void)tensor;
    (void)tag;
    throw CommError(backend() + " communicator cannot receive from rank " + std::to_string(src));
  }

  // Bytes this rank's own sends put on the wire for reduce-scatters the communicator runs itself (Gloo's
  // ring: (N-1)/N of each buffer); 0 where the backend runs them.
  virtual std::int64_t ring_bytes_sent() const { return 0; }

  // What ran instead of a missing collective (e.g. "gloo all_reduce avg via sum"), recorded in
  // the RunRecord so the simulator models what really ran.
  virtual std::vector<std::string> fallbacks() const = 0;
};

}  // namespace zeroplan::exec
