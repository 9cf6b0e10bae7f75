// Communicators over c10d process groups: Gloo on CPU, NCCL on CUDA (when ZEROPLAN_HAVE_NCCL).
//
// What Gloo lacks is run as a correct fallback and reported by fallbacks() on first use, e.g.
// "gloo all_reduce avg via sum then divide by world size"; its reduce-scatter is a ring of send/recv
// steps over a second process group ((N-1)/N of the buffer per rank, as NCCL's). A failed or
// timed-out collective makes Work::wait() throw CommError with one line:
// "rank 0: gloo all_reduce #7 (4096 bytes) failed: rank 1 exited with signal 9 (killed)".
#pragma once

#include <zeroplan/exec/communicator.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace zeroplan::exec {

struct C10dOptions {
  // Every collective fails with CommError after this long without completing.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Gloo: address to bind ("127.0.0.1" for loopback runs; "" = this machine's hostname).
  std::string hostname = "127.0.0.1";
  // Gloo: bind to this network interface instead (like GLOO_SOCKET_IFNAME); wins over hostname.
  std::string interface;
  int gloo_threads = 2;
  // NCCL: CUDA device index of this rank (usually LOCAL_RANK).
  int cuda_device = 0;
  // Called once after a collective fails, to name the peer that caused it ("rank 1 exited ...").
  // Returns "" when it cannot tell. Rendezvous installs one that reads the store's heartbeats.
  std::function<std::string()> diagnose;
};

// REQUIRES: all ranks call with the same store (or one prefixing the same keys) and world_size.
// Throws CommError when the group cannot be formed within options.timeout.
std::unique_ptr<Communicator> make_gloo_communicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                     int rank, int world_size,
                                                     const C10dOptions& options = {});

// Throws CommError when this build has no NCCL (ZEROPLAN_HAVE_NCCL == 0).
std::unique_ptr<Communicator> make_nccl_communicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                     int rank, int world_size,
                                                     const C10dOptions& options = {});

// True when this build can create NCCL communicators (it still needs a GPU at run time).
bool have_nccl();

}  // namespace zeroplan::exec
