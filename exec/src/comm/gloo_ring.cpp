#include "gloo_ring.h"

#include <exception>

namespace zeroplan::exec::detail {
namespace {
constexpr int kRingTag = 0x5a52;
}  // namespace

JobThread::JobThread() : state_(std::make_shared<State>()) {
  thread_ = std::thread([s = state_] { run(*s); });
}

JobThread::~JobThread() {
  bool busy = false;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
    busy = state_->busy;
  }
  state_->cv.notify_all();
  // A job still running waits on a peer that may be gone: it ends at its timeout, on its own.
  if (busy) thread_.detach();
  else thread_.join();
}

std::future<void> JobThread::submit(std::function<void()> job) {
  std::promise<void> done;
  std::future<void> f = done.get_future();
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->jobs.emplace_back(std::move(job), std::move(done));
  }
  state_->cv.notify_all();
  return f;
}

void JobThread::run(State& s) {
  for (;;) {
    std::pair<std::function<void()>, std::promise<void>> job;
    {
      std::unique_lock<std::mutex> lock(s.mutex);
      s.cv.wait(lock, [&] { return s.stop || !s.jobs.empty(); });
      if (s.stop) return;
      job = std::move(s.jobs.front());
      s.jobs.pop_front();
      s.busy = true;
    }
    std::exception_ptr error;
    try {
      job.first();
    } catch (...) {
      error = std::current_exception();
    }
    job.first = nullptr;  // its tensors go before the waiter wakes
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.busy = false;
    }
    if (error) job.second.set_exception(error);
    else job.second.set_value();
  }
}

RingBuffers ring_buffers(const at::Tensor& out, int world) {
  const std::int64_t chunk = out.numel();
  return {at::empty({chunk}, out.options()), world > 2 ? at::empty({chunk}, out.options()) : at::Tensor()};
}

std::function<void()> ring_reduce_scatter_job(std::shared_ptr<Communicator> ring, at::Tensor in, at::Tensor out,
                                              RingBuffers buffers, int rank, int world,
                                              std::shared_ptr<std::atomic<std::int64_t>> sent) {
  return [ring = std::move(ring), in, out, recv = buffers.recv, acc = buffers.acc, n = world, r = rank,
          sent = std::move(sent)]() mutable {
    const std::int64_t chunk = out.numel();
    auto part = [&](int k) { return in.narrow(0, ((k % n) + n) % n * chunk, chunk); };
    at::Tensor send = part(r - 1);
    for (int step = 0; step + 1 < n; ++step) {
      auto s = ring->send(send, (r + 1) % n, kRingTag);
      auto got = ring->recv(recv, (r + n - 1) % n, kRingTag);
      got->wait();
      s->wait();
      sent->fetch_add(static_cast<std::int64_t>(send.nbytes()));
      // The chunk received is the running sum of chunk r - step - 2; the last step's is this rank's.
      if (step + 2 == n) {
        at::add_out(out, part(r - step - 2), recv);
      } else {
        at::add_out(acc, part(r - step - 2), recv);
        send = acc;
      }
    }
  };
}

}  // namespace zeroplan::exec::detail
