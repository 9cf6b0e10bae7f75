// Completion times of asynchronous collectives of one communicator: a watcher thread waits the works in
// issue order (a process group runs them FIFO), so each gets a span [max(issue, previous end), end] on
// its lane without the main thread blocking early. The main thread waits through wait(), which records
// the exposed (blocking) time as "comm_wait" and rethrows a collective's error. One tracker per
// communicator: works of another process group complete on their own, and a wait must not queue behind
// them.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "zeroplan/exec/communicator.h"
#include "zeroplan/exec/recorder.h"

namespace zeroplan::exec {

class CommTracker {
 public:
  struct Entry {
    std::unique_ptr<Work> work;
    std::string name, phase;
    int unit = -1, microbatch = -1;
    double t_issue = 0, t_start = 0, t_end = 0;
    bool done = false;
    bool recorded = false;
    std::exception_ptr error;
  };
  using Handle = std::shared_ptr<Entry>;

  explicit CommTracker(Recorder& rec, Lane lane = Lane::comm) : rec_(rec), lane_(lane), thread_([this] { run(); }) {}
  ~CommTracker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  CommTracker(const CommTracker&) = delete;
  CommTracker& operator=(const CommTracker&) = delete;

  Handle issue(std::unique_ptr<Work> work, double t_issue, std::string name, std::string phase, int unit,
               int microbatch) {
    auto e = std::make_shared<Entry>();
    e->work = std::move(work);
    e->name = std::move(name);
    e->phase = std::move(phase);
    e->unit = unit;
    e->microbatch = microbatch;
    e->t_issue = t_issue;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(e);
    }
    cv_.notify_all();
    return e;
  }

  void wait(const Handle& e) {
    const double t0 = rec_.now_s();
    {
      std::unique_lock<std::mutex> lock(mutex_);
      done_cv_.wait(lock, [&] { return e->done; });
    }
    rec_.add_phase("comm_wait", rec_.now_s() - t0);
    // What the work still holds (Gloo's reduce-scatter's full-size copy) is let go here, by the waiter,
    // where the simulator frees it: not when the collective completed on this thread, a moment the peer
    // decides (it moved a stage-3 peak by a unit's gradients from run to run).
    e->work.reset();
    if (!e->recorded) {
      e->recorded = true;
      rec_.span(lane_, e->name, e->t_start, e->t_end, e->phase, e->unit, e->microbatch);
    }
    if (e->error) std::rethrow_exception(e->error);
  }

 private:
  void run() {
    double last_end = 0;
    for (;;) {
      Handle e;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        e = queue_.front();
        queue_.pop_front();
      }
      try {
        e->work->wait();
      } catch (...) {
        e->error = std::current_exception();
      }
      const double t_end = rec_.now_s();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        e->t_start = std::max(e->t_issue, last_end);
        e->t_end = std::max(t_end, e->t_start);
        last_end = e->t_end;
        e->done = true;
      }
      done_cv_.notify_all();
    }
  }

  Recorder& rec_;
  const Lane lane_;
  std::mutex mutex_;
  std::condition_variable cv_, done_cv_;
  std::deque<Handle> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace zeroplan::exec
