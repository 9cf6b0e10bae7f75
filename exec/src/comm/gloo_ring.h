// Gloo's reduce-scatter as a ring of send/recv steps, run off the caller's thread (c10d_communicator.cpp
// uses it for every Gloo reduce-scatter). Gloo's own reduce_scatter_single all-reduces a full-size clone:
// 2(N-1)/N of the buffer on the wire per rank and a full-size temporary. The ring, as NCCL runs it, sends
// (N-1)/N of the buffer per rank and needs one chunk (two with more than two ranks).
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "zeroplan/exec/communicator.h"

namespace zeroplan::exec::detail {

// One thread that runs jobs in the order submitted: the steps of Gloo reduce-scatters, each of which
// waits for a receive before it adds and sends on, off the caller's thread. A job's captures are released
// before its future is made ready, so the waiting thread holds the last references to what it handed.
class JobThread {
 public:
  JobThread();
  ~JobThread();
  JobThread(const JobThread&) = delete;
  JobThread& operator=(const JobThread&) = delete;

  std::future<void> submit(std::function<void()> job);

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::pair<std::function<void()>, std::promise<void>>> jobs;
    bool stop = false;
    bool busy = false;
  };
  static void run(State& s);
  std::shared_ptr<State> state_;
  std::thread thread_;
};

// The buffers of one ring reduce-scatter: made by ring_buffers on the caller's thread, handed to the job
// and freed at the collective's wait (where the simulator frees them).
struct RingBuffers {
  at::Tensor recv;  // the chunk received
  at::Tensor acc;   // the running sum sent on (more than two ranks only)
};
RingBuffers ring_buffers(const at::Tensor& out, int world);

// The job that reduce-scatters `in` (world x out.numel() elements) into `out` over `ring` (a process group
// of the same ranks used for nothing else): N-1 steps, each sending one chunk to the next rank and adding
// the chunk received from the previous one to this rank's own. Two ranks sum a + b as an all-reduce does,
// bit for bit. Adds the bytes its sends put on the wire to `sent`.
std::function<void()> ring_reduce_scatter_job(std::shared_ptr<Communicator> ring, at::Tensor in, at::Tensor out,
                                              RingBuffers buffers, int rank, int world,
                                              std::shared_ptr<std::atomic<std::int64_t>> sent);

}  // namespace zeroplan::exec::detail
