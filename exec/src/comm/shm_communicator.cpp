// Shared-memory collectives between the ranks of one host (shm_communicator.h).
//
// The segment: per rank a slot header (two counters on cache lines of their own) and a staging area of
// chunk_bytes. A collective runs in rounds k = 1, 2, ...: a rank waits until every rank has consumed
// round k-1 (so its staging area may be overwritten), writes its part, publishes k, waits until every rank
// has published k, reads what it needs from the others' areas, and marks k consumed. Every rank runs the
// same collectives in the same order, so the rounds line up.
#include <zeroplan/exec/shm_communicator.h>

#include "shm_segment.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>

namespace zeroplan::exec {
namespace {

using shm::Counter;
using shm::kLine;
using shm::Layout;
using shm::SlotHeader;

class ShmWork final : public Work {
 public:
  explicit ShmWork(std::shared_future<void> done) : done_(std::move(done)) {}
  void wait() override { done_.get(); }

 private:
  std::shared_future<void> done_;
};

class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(std::unique_ptr<Communicator> base, const ShmOptions& options, const Layout& layout, char* addr,
                  std::vector<pid_t> pids)
      : base_(std::move(base)),
        options_(options),
        rank_(base_->rank()),
        world_(base_->world_size()),
        chunk_(layout.chunk),
        stride_(layout.stride),
        bytes_(layout.bytes),
        base_addr_(addr),
        pids_(std::move(pids)) {
    worker_ = std::thread([this] { run(); });
  }
  ~ShmCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    if (base_addr_ != nullptr) munmap(base_addr_, bytes_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "shm"; }

  std::unique_ptr<Work> all_reduce(torch::Tensor& tensor, ReduceOp op) override {
    if (!ours(tensor)) return delegate([&] { return base_->all_reduce(tensor, op); });
    return submit([this, t = tensor, op] { all_reduce_now(t, op); });
  }
  std::unique_ptr<Work> all_gather(torch::Tensor& output, const torch::Tensor& input) override {
    TORCH_CHECK(output.numel() == input.numel() * world_, "all_gather: output has ", output.numel(), " elements, not ",
                world_, " x ", input.numel());
    if (!ours(output) || !ours(input) || output.scalar_type() != input.scalar_type())
      return delegate([&] { return base_->all_gather(output, input); });
    return submit([this, out = output, in = input] { all_gather_now(out, in); });
  }
  std::unique_ptr<Work> reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) override {
    TORCH_CHECK(input.numel() == output.numel() * world_, "reduce_scatter: input has ", input.numel(),
                " elements, not ", world_, " x ", output.numel());
    if (!ours(output) || !ours(input) || output.scalar_type() != input.scalar_type())
      return delegate([&] { return base_->reduce_scatter(output, input, op); });
    return submit([this, out = output, in = input, op] { reduce_scatter_now(out, in, op); });
  }
  std::unique_ptr<Work> broadcast(torch::Tensor& tensor, int root) override {
    if (!ours(tensor)) return delegate([&] { return base_->broadcast(tensor, root); });
    return submit([this, t = tensor, root] { broadcast_now(t, root); });
  }
  void barrier() override {
    drain();
    base_->barrier();
  }
  std::unique_ptr<Communicator> split(int group_size) override {
    drain();
    return make_shm_communicator(base_->split(group_size), options_);  // its ranks share this host too
  }
  std::unique_ptr<Communicator> duplicate() override {
    drain();
    return make_shm_communicator(base_->duplicate(), options_);
  }
  std::unique_ptr<Work> send(const torch::Tensor& tensor, int dst, int tag) override {
    return delegate([&] { return base_->send(tensor, dst, tag); });
  }
  std::unique_ptr<Work> recv(torch::Tensor& tensor, int src, int tag) override {
    return delegate([&] { return base_->recv(tensor, src, tag); });
  }
  std::int64_t ring_bytes_sent() const override { return base_->ring_bytes_sent(); }
  std::vector<std::string> fallbacks() const override { return base_->fallbacks(); }

 private:
  // ---- the segment ----
  SlotHeader& header(int q) const { return *reinterpret_cast<SlotHeader*>(base_addr_ + stride_ * static_cast<std::size_t>(q)); }
  char* area(int q) const { return base_addr_ + stride_ * static_cast<std::size_t>(q) + sizeof(SlotHeader); }

  // ---- rounds ----
  // Waits until every rank's counter (published or consumed) reaches k. A peer whose process is gone fails
  // the collective at once, one that stops arriving after the timeout; `diagnose` then names why.
  void wait_all(Counter SlotHeader::*counter, std::uint64_t k) {
    const auto start = std::chrono::steady_clock::now();
    auto next_check = start + std::chrono::milliseconds(100);
    for (int q = 0; q < world_; ++q) {
      for (std::uint64_t spins = 0; (header(q).*counter).value.load(std::memory_order_acquire) < k; ++spins) {
        if (spins < 256) continue;
        if (spins < 2048) {
          std::this_thread::yield();
          continue;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        const auto now = std::chrono::steady_clock::now();
        if (now < next_check) continue;
        next_check = now + std::chrono::milliseconds(100);
        std::string why;
        if (kill(pids_[static_cast<std::size_t>(q)], 0) != 0 && errno == ESRCH)
          why = fmt::format("rank {} exited", q);
        else if (now - start > options_.timeout)
          why = fmt::format("rank {} did not arrive within {} ms", q, options_.timeout.count());
        if (why.empty()) continue;
        if (options_.diagnose)
          if (std::string named = options_.diagnose(); !named.empty()) why = std::move(named);
        throw CommError(fmt::format("rank {}: shm {} #{} ({} bytes) failed: {}", rank_, op_, op_seq_, op_bytes_, why));
      }
    }
  }
  // One round: `write` stages this rank's part, `read` takes what it needs once every rank's is there.
  template <class Write, class Read>
  void round(Write&& write, Read&& read) {
    const std::uint64_t k = ++round_;
    wait_all(&SlotHeader::consumed, k - 1);
    write(area(rank_));
    header(rank_).published.value.store(k, std::memory_order_release);
    wait_all(&SlotHeader::published, k);
    read();
    header(rank_).consumed.value.store(k, std::memory_order_release);
  }
  torch::Tensor view(char* p, std::int64_t n, const torch::Tensor& like) const {
    return torch::from_blob(p, {n}, like.options());
  }

  // ---- the collectives, on the worker ----
  void begin(const char* op, std::int64_t bytes) {
    op_ = op;
    op_bytes_ = bytes;
    ++op_seq_;
  }
  // n elements in rounds of `piece`: write(mine, off, len) stages this rank's part, read(off, len) takes the
  // round's result once every rank's part is there.
  template <class Write, class Read>
  void in_rounds(std::int64_t n, std::int64_t piece, Write&& write, Read&& read) {
    for (std::int64_t off = 0; off < n; off += piece) {
      const std::int64_t len = std::min(piece, n - off);
      round([&](char* mine) { write(mine, off, len); }, [&] { read(off, len); });
    }
  }
  static std::size_t size(std::int64_t elems, std::int64_t es) { return static_cast<std::size_t>(elems * es); }

  void all_reduce_now(torch::Tensor t, ReduceOp op) {
    begin("all_reduce", t.nbytes());
    const std::int64_t es = t.element_size();
    char* data = static_cast<char*>(t.data_ptr());
    in_rounds(
        t.numel(), static_cast<std::int64_t>(chunk_) / es,
        [&](char* mine, std::int64_t off, std::int64_t len) { std::memcpy(mine, data + off * es, size(len, es)); },
        [&](std::int64_t off, std::int64_t len) {
          torch::Tensor out = view(data + off * es, len, t);
          out.copy_(view(area(0), len, t));  // every rank's values added in rank order: the same bits everywhere
          for (int q = 1; q < world_; ++q) out.add_(view(area(q), len, t));
        });
    if (op == ReduceOp::kAvg) t.div_(world_);
  }
  void all_gather_now(torch::Tensor out, torch::Tensor in) {
    begin("all_gather", out.nbytes());
    const std::int64_t es = in.element_size(), n = in.numel();
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    in_rounds(
        n, static_cast<std::int64_t>(chunk_) / es,
        [&](char* mine, std::int64_t off, std::int64_t len) { std::memcpy(mine, src + off * es, size(len, es)); },
        [&](std::int64_t off, std::int64_t len) {
          for (int q = 0; q < world_; ++q) std::memcpy(dst + (q * n + off) * es, area(q), size(len, es));
        });
  }
  void reduce_scatter_now(torch::Tensor out, torch::Tensor in, ReduceOp op) {
    begin("reduce_scatter", in.nbytes());
    // Each round stages this rank's piece for every other rank (world pieces of `len`); its own piece is
    // read from the input itself.
    const std::int64_t es = in.element_size(), n = out.numel();
    const char* src = static_cast<const char*>(in.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    in_rounds(
        n, static_cast<std::int64_t>(chunk_) / (es * world_),
        [&](char* mine, std::int64_t off, std::int64_t len) {
          for (int q = 0; q < world_; ++q)
            if (q != rank_) std::memcpy(mine + q * len * es, src + (q * n + off) * es, size(len, es));
        },
        [&](std::int64_t off, std::int64_t len) {
          torch::Tensor o = view(dst + off * es, len, out);
          auto part = [&](int q) {
            return q == rank_ ? view(const_cast<char*>(src) + (rank_ * n + off) * es, len, out)
                              : view(area(q) + rank_ * len * es, len, out);
          };
          o.copy_(part(0));
          for (int q = 1; q < world_; ++q) o.add_(part(q));
        });
    if (op == ReduceOp::kAvg) out.div_(world_);
  }
  void broadcast_now(torch::Tensor t, int root) {
    begin("broadcast", t.nbytes());
    const std::int64_t es = t.element_size();
    char* data = static_cast<char*>(t.data_ptr());
    in_rounds(
        t.numel(), static_cast<std::int64_t>(chunk_) / es,
        [&](char* mine, std::int64_t off, std::int64_t len) {
          if (rank_ == root) std::memcpy(mine, data + off * es, size(len, es));
        },
        [&](std::int64_t off, std::int64_t len) {
          if (rank_ != root) std::memcpy(data + off * es, area(root), size(len, es));
        });
  }

  // ---- the worker ----
  struct Job {
    std::function<void()> run;  // holds the collective's tensors
    std::promise<void> done;
  };
  static bool ours(const torch::Tensor& t) { return t.device().is_cpu() && t.is_contiguous() && !t.is_sparse(); }
  std::unique_ptr<Work> submit(std::function<void()> job) {
    Job j;
    j.run = std::move(job);
    std::shared_future<void> done = j.done.get_future().share();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(j));
      last_ = done;
    }
    cv_.notify_all();
    return std::make_unique<ShmWork>(std::move(done));
  }
  // Runs a job and lets go of its tensors before its waiter wakes: the caller frees a buffer once the
  // collective's wait returns (Gloo's works drop theirs then), and the peak must not see it twice.
  void run_job(Job& j) {
    std::exception_ptr failed;
    try {
      if (!broken_.empty()) throw CommError(broken_);
      j.run();
    } catch (const CommError& e) {
      broken_ = e.what();  // the rounds no longer line up: every later collective fails the same way
      failed = std::current_exception();
    } catch (...) {
      failed = std::current_exception();
    }
    j.run = nullptr;
    if (failed) {
      j.done.set_exception(failed);
    } else {
      j.done.set_value();
    }
  }
  // What goes to the base communicator runs after the shared-memory work issued before it.
  void drain() {
    std::shared_future<void> last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = last_;
    }
    if (last.valid()) last.wait();  // its error, if any, is the caller's to see on its own Work
  }
  template <class F>
  std::unique_ptr<Work> delegate(F&& f) {
    drain();
    return f();
  }
  void run() {
    torch::NoGradGuard no_grad;  // the collectives write into parameters and gradients in place
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Job job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      run_job(job);
      lock.lock();
    }
  }

  std::unique_ptr<Communicator> base_;
  ShmOptions options_;
  int rank_ = 0, world_ = 1;
  std::size_t chunk_ = 0, stride_ = 0, bytes_ = 0;
  char* base_addr_ = nullptr;
  std::vector<pid_t> pids_;  // per rank: a peer whose process is gone is found at once
  std::uint64_t round_ = 0;  // worker thread only
  const char* op_ = "";      // worker thread only: the collective running, its number and bytes
  std::uint64_t op_seq_ = 0;
  std::int64_t op_bytes_ = 0;
  std::string broken_;       // worker thread only
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::shared_future<void> last_;
  bool stop_ = false;
  std::thread worker_;  // last: starts once the members above exist
};

}  // namespace

std::string cpu_backend(bool one_host) {
  const char* env = std::getenv("ZEROPLAN_CPU_TRANSPORT");
  const std::string asked = env != nullptr && *env ? env : "auto";
  if (asked != "auto" && asked != "gloo" && asked != "shm")
    throw CommError(fmt::format("ZEROPLAN_CPU_TRANSPORT={}: auto, gloo or shm", asked));
  if (asked == "shm" && !one_host) throw CommError("ZEROPLAN_CPU_TRANSPORT=shm: the ranks are not all on this host");
  return asked == "gloo" || !one_host ? "gloo" : "shm";
}

std::unique_ptr<Communicator> make_shm_communicator(std::unique_ptr<Communicator> base, const ShmOptions& options) {
  const int world = base->world_size();
  if (options.chunk_bytes < static_cast<std::int64_t>(kLine) * world)
    throw CommError(fmt::format("shared memory: chunk_bytes {} is under {} ({} ranks)", options.chunk_bytes,
                                kLine * static_cast<std::size_t>(world), world));
  const Layout layout(options.chunk_bytes, world);
  std::vector<pid_t> pids;
  std::string why;
  char* addr = shm::open_segment(*base, layout.bytes, pids, why);
  if (addr == nullptr) {
    // Every rank keeps Gloo (its record's backend says so); rank 0 and each rank that failed say why.
    if (!why.empty() || base->rank() == 0)
      fmt::print(stderr, "zeroplan: rank {}: shared memory: {}; collectives over Gloo\n", base->rank(),
                 why.empty() ? "another rank could not map the segment" : why);
    return base;
  }
  return std::make_unique<ShmCommunicator>(std::move(base), options, layout, addr, std::move(pids));
}

}  // namespace zeroplan::exec
