// Communicator over a c10d Backend (ProcessGroupGloo, ProcessGroupNCCL).
#include <zeroplan/exec/c10d_communicator.h>

#include <zeroplan/config.h>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#if ZEROPLAN_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "errors.h"
#include "gloo_ring.h"

namespace zeroplan::exec {
namespace {

// What ran for a collective Gloo does not have; the simulator models these (see REFERENCE.md).
constexpr const char* kGlooAvgFallback = "gloo all_reduce avg via sum then divide by world size";
constexpr const char* kGlooReduceScatterAvgFallback =
    "gloo reduce_scatter avg via sum then divide by world size";

// The flat all-gather and reduce-scatter of one buffer: all_gather_single / reduce_scatter_single in the
// pinned torch, _allgather_base / _reduce_scatter_base in the torch of the lent GPU machines (2.11), which
// the GPU kit builds against (-DZEROPLAN_TORCH_FROM); whichever the backend declares.
template <class B>
c10::intrusive_ptr<c10d::Work> all_gather_flat(B& pg, at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& o) {
  if constexpr (requires { pg.all_gather_single(out, in, o); })
    return pg.all_gather_single(out, in, o);
  else
    return pg._allgather_base(out, in, o);
}
template <class B>
c10::intrusive_ptr<c10d::Work> reduce_scatter_flat(B& pg, at::Tensor& out, at::Tensor& in,
                                                   const c10d::ReduceScatterOptions& o) {
  if constexpr (requires { pg.reduce_scatter_single(out, in, o); })
    return pg.reduce_scatter_single(out, in, o);
  else
    return pg._reduce_scatter_base(out, in, o);
}

class C10dCommunicator;

class C10dWork final : public Work {
 public:
  // `handed`: tensors made for the collective and held by nobody but c10d and this work once it is issued
  // (views of the caller's buffers, Gloo's reduce-scatter copy). wait() waits until c10d has let go of
  // them; this work keeps them until it is destroyed, so their memory goes where its owner drops it (the
  // simulator's wait), not when the collective completes on a watcher thread.
  C10dWork(const C10dCommunicator* comm, std::string what, std::vector<c10::intrusive_ptr<c10d::Work>> works,
           std::function<void()> after, const std::vector<at::Tensor>& handed = {})
      : comm_(comm), what_(std::move(what)), works_(std::move(works)), after_(std::move(after)), handed_(handed) {}
  // A collective run as a job of steps (JobThread): done when `job` is.
  C10dWork(const C10dCommunicator* comm, std::string what, std::future<void> job, std::function<void()> after,
           const std::vector<at::Tensor>& handed)
      : comm_(comm), what_(std::move(what)), job_(std::move(job)), after_(std::move(after)), handed_(handed) {}
  void wait() override;

 private:
  const C10dCommunicator* comm_;
  std::string what_;
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;  // one collective, or the parts of one
  std::future<void> job_;                              // or a job of steps
  std::function<void()> after_;
  std::vector<at::Tensor> handed_;
  bool done_ = false;
};

class C10dCommunicator final : public Communicator {
 public:
  // `make_group(store_prefix, rank, size)` forms a group of the same kind (split()).
  using MakeGroup = std::function<std::unique_ptr<Communicator>(const std::string&, int, int)>;
  C10dCommunicator(c10::intrusive_ptr<c10d::Backend> pg, std::string backend, int rank, int world,
                   C10dOptions options, bool native_avg, MakeGroup make_group = {})
      : make_group_(std::move(make_group)),
        pg_(std::move(pg)),
        backend_(std::move(backend)),
        rank_(rank),
        world_(world),
        options_(std::move(options)),
        native_avg_(native_avg) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return backend_; }

  std::unique_ptr<Communicator> split(int group_size) override {
    if (group_size < 1 || world_ % group_size != 0 || !make_group_) {
      throw CommError(fmt::format("rank {}: {} ranks cannot be split into groups of {}", rank_, world_, group_size));
    }
    const int group = rank_ / group_size;
    // Numbered like duplicate(): a later split (the next executor in the same job) gets keys of its own.
    return make_group_(fmt::format("zeroplan/group{}x{}.{}/", group, group_size, splits_++), rank_ % group_size, group_size);
  }

  std::unique_ptr<Communicator> duplicate() override {
    if (!make_group_) throw CommError(fmt::format("rank {}: this {} group cannot form a second one", rank_, backend_));
    auto d = make_group_(fmt::format("zeroplan/dup{}/", duplicates_++), rank_, world_);
    // Its fallbacks are this group's (same ranks, same collectives): noted here, for the RunRecord.
    if (auto* c = dynamic_cast<C10dCommunicator*>(d.get())) c->notes_to_ = notes_to_;
    return d;
  }

  std::unique_ptr<Work> all_reduce(torch::Tensor& tensor, ReduceOp op) override {
    TORCH_CHECK(tensor.is_contiguous(), "all_reduce needs a contiguous tensor");
    c10d::AllreduceOptions opts;
    opts.timeout = options_.timeout;
    opts.reduceOp = c10d_op(op, kGlooAvgFallback);
    std::vector<at::Tensor> tensors{tensor};
    std::function<void()> after;
    if (op == ReduceOp::kAvg && !native_avg_) {
      after = [t = tensor, n = world_]() mutable { t.div_(n); };
    }
    return issue("all_reduce", tensor.nbytes(), [&] { return pg_->allreduce(tensors, opts); },
                 std::move(after));
  }

  std::unique_ptr<Work> all_gather(torch::Tensor& output, const torch::Tensor& input) override {
    TORCH_CHECK(output.is_contiguous() && input.is_contiguous(), "all_gather needs contiguous tensors");
    TORCH_CHECK(output.numel() == input.numel() * world_ && output.dtype() == input.dtype(),
                "all_gather: output has ", output.numel(), " elements, expected ", world_, " x ",
                input.numel());
    at::Tensor out = output.view({-1});
    at::Tensor in = input.view({-1});
    if (backend_ == "gloo") {
      // Gloo's all_gather_single gathers into a full-size flat temporary and copies it out; one
      // broadcast per rank straight into the output's chunks moves the same bytes with no temporary
      // and took 1/2-1/4 of the time on 28-100 MiB (bench/gloo_collectives.py). In place when `input`
      // is this rank's chunk of `output`.
      // The chunks are views made here and held by c10d alone once issued: wait() waits until Gloo lets
      // go of them, so the output's storage is freed where its owner drops it.
      std::vector<at::Tensor> chunks = out.chunk(world_);
      return issue("all_gather", output.nbytes(), [&] {
        if (chunks[static_cast<std::size_t>(rank_)].data_ptr() != in.data_ptr()) {
          chunks[static_cast<std::size_t>(rank_)].copy_(in);
        }
        std::vector<c10::intrusive_ptr<c10d::Work>> works;
        for (int r = 0; r < world_; ++r) {
          c10d::BroadcastOptions opts;
          opts.rootRank = r;
          opts.timeout = options_.timeout;
          std::vector<at::Tensor> part{chunks[static_cast<std::size_t>(r)]};
          works.push_back(pg_->broadcast(part, opts));
        }
        return works;
      }, {}, chunks);
    }
    c10d::AllgatherOptions opts;
    opts.timeout = options_.timeout;
    return issue("all_gather", output.nbytes(),
                 [&] { return all_gather_flat(*pg_, out, in, opts); }, {});
  }

  std::unique_ptr<Work> reduce_scatter(torch::Tensor& output, const torch::Tensor& input,
                                       ReduceOp op) override {
    TORCH_CHECK(output.is_contiguous() && input.is_contiguous(),
                "reduce_scatter needs contiguous tensors");
    TORCH_CHECK(input.numel() == output.numel() * world_ && output.dtype() == input.dtype(),
                "reduce_scatter: input has ", input.numel(), " elements, expected ", world_, " x ",
                output.numel());
    c10d::ReduceScatterOptions opts;
    opts.timeout = options_.timeout;
    opts.reduceOp = c10d_op(op, kGlooReduceScatterAvgFallback);
    at::Tensor out = output.view({-1});
    // c10d takes the input by non-const reference; it only reads it.
    at::Tensor in = input.view({-1});
    const bool divide = op == ReduceOp::kAvg && !native_avg_;
    if (backend_ == "gloo") return ring_reduce_scatter(out, in, divide, input.nbytes());
    std::function<void()> after;
    if (divide) after = [t = output, n = world_]() mutable { t.div_(n); };
    return issue("reduce_scatter", input.nbytes(),
                 [&] { return reduce_scatter_flat(*pg_, out, in, opts); }, std::move(after));
  }

  std::unique_ptr<Work> broadcast(torch::Tensor& tensor, int root) override {
    TORCH_CHECK(tensor.is_contiguous(), "broadcast needs a contiguous tensor");
    TORCH_CHECK(root >= 0 && root < world_, "broadcast root ", root, " outside [0, ", world_, ")");
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = options_.timeout;
    std::vector<at::Tensor> tensors{tensor};
    return issue("broadcast", tensor.nbytes(), [&] { return pg_->broadcast(tensors, opts); }, {});
  }

  std::unique_ptr<Work> send(const torch::Tensor& tensor, int dst, int tag) override {
    TORCH_CHECK(tensor.is_contiguous(), "send needs a contiguous tensor");
    TORCH_CHECK(dst >= 0 && dst < world_ && dst != rank_, "send to rank ", dst, " of ", world_, " from rank ", rank_);
    std::vector<at::Tensor> tensors{tensor};
    return issue("send", tensor.nbytes(), [&] { return pg_->send(tensors, dst, tag); }, {});
  }

  std::unique_ptr<Work> recv(torch::Tensor& tensor, int src, int tag) override {
    TORCH_CHECK(tensor.is_contiguous(), "recv needs a contiguous tensor");
    TORCH_CHECK(src >= 0 && src < world_ && src != rank_, "recv from rank ", src, " of ", world_, " on rank ", rank_);
    std::vector<at::Tensor> tensors{tensor};
    return issue("recv", tensor.nbytes(), [&] { return pg_->recv(tensors, src, tag); }, {});
  }

  void barrier() override {
    c10d::BarrierOptions opts;
    opts.timeout = options_.timeout;
    issue("barrier", 0, [&] { return pg_->barrier(opts); }, {})->wait();
  }

  std::int64_t ring_bytes_sent() const override { return ring_bytes_sent_->load(); }

  std::vector<std::string> fallbacks() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return {fallbacks_.begin(), fallbacks_.end()};
  }

  // One line for a failed collective, with the diagnosis of the peers when there is one.
  std::string failure(const std::string& what, const std::string& cause) const {
    // Diagnose once: later failures of the same group have the same cause.
    std::call_once(diagnosed_, [this] {
      if (!options_.diagnose) return;
      try {
        diagnosis_ = options_.diagnose();
      } catch (const std::exception&) {
      }
    });
    const std::string& diag = diagnosis_;
    return fmt::format("rank {}: {} {} failed: {}", rank_, backend_, what,
                       diag.empty() ? cause : fmt::format("{} ({})", diag, cause));
  }

 private:
  c10d::ReduceOp c10d_op(ReduceOp op, const char* fallback) {
    if (op == ReduceOp::kSum) return c10d::ReduceOp::SUM;
    if (native_avg_) return c10d::ReduceOp::AVG;
    note(fallback);
    return c10d::ReduceOp::SUM;
  }

  void note(const char* fallback) {
    if (notes_to_ != this) return notes_to_->note(fallback);
    std::lock_guard<std::mutex> lock(mutex_);
    fallbacks_.insert(fallback);
  }

  // Gloo reduce-scatters run as a ring (gloo_ring.h) on a second process group of the same ranks, driven
  // by one thread of its own (each step waits for its receive), so the caller goes on computing.
  std::unique_ptr<Work> ring_reduce_scatter(at::Tensor out, at::Tensor in, bool divide, std::size_t bytes) {
    if (!ring_) {
      ring_comm_ = std::shared_ptr<Communicator>(duplicate());  // collective: every rank's first reduce-scatter
      ring_ = std::make_unique<detail::JobThread>();
    }
    detail::RingBuffers buffers = detail::ring_buffers(out, world_);
    std::vector<at::Tensor> handed{buffers.recv};
    if (buffers.acc.defined()) handed.push_back(buffers.acc);
    std::string what = fmt::format("reduce_scatter #{} ({} bytes)", ++sequence_, bytes);
    auto job = detail::ring_reduce_scatter_job(ring_comm_, in, out, buffers, rank_, world_, ring_bytes_sent_);
    std::function<void()> after;
    if (divide) after = [out, n = world_]() mutable { out.div_(n); };
    return std::make_unique<C10dWork>(this, std::move(what), ring_->submit(std::move(job)), std::move(after), handed);
  }

  template <class Issue>
  std::unique_ptr<Work> issue(const char* name, size_t bytes, Issue&& start, std::function<void()> after,
                              const std::vector<at::Tensor>& handed = {}) {
    std::string what = fmt::format("{} #{} ({} bytes)", name, ++sequence_, bytes);
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    try {
      auto started = start();
      if constexpr (std::is_same_v<decltype(started), std::vector<c10::intrusive_ptr<c10d::Work>>>) {
        works = std::move(started);
      } else {
        works.push_back(std::move(started));
      }
    } catch (const std::exception& e) {
      throw CommError(failure(what, detail::first_line(e.what())));
    }
    return std::make_unique<C10dWork>(this, std::move(what), std::move(works), std::move(after), handed);
  }

  MakeGroup make_group_;
  int duplicates_ = 0;                 // duplicate() calls so far: each names its own store prefix
  int splits_ = 0;                     // split() calls so far, likewise
  C10dCommunicator* notes_to_ = this;  // a duplicate's fallbacks go to the group it duplicates
  c10::intrusive_ptr<c10d::Backend> pg_;
  std::string backend_;
  int rank_;
  int world_;
  C10dOptions options_;
  bool native_avg_;
  int64_t sequence_ = 0;
  mutable std::once_flag diagnosed_;
  mutable std::string diagnosis_;
  mutable std::mutex mutex_;
  std::set<std::string> fallbacks_;
  // Gloo reduce-scatters: the ring's process group, its thread (declared after the group: destroyed
  // first) and the bytes its sends put on the wire.
  std::shared_ptr<Communicator> ring_comm_;
  std::unique_ptr<detail::JobThread> ring_;
  std::shared_ptr<std::atomic<std::int64_t>> ring_bytes_sent_ = std::make_shared<std::atomic<std::int64_t>>(0);
};

void C10dWork::wait() {
  if (done_) return;
  done_ = true;
  try {
    for (auto& w : works_) w->wait();
    if (job_.valid()) job_.get();
  } catch (const CommError& e) {
    // A step of a ring failed: its own line names the step; say which collective it was.
    throw CommError(comm_->failure(what_, detail::first_line(e.what())));
  } catch (const std::exception& e) {
    throw CommError(comm_->failure(what_, detail::first_line(e.what())));
  }
  if (after_) after_();
  after_ = nullptr;
  works_.clear();
  // Gloo's worker thread lets go of a finished collective (its input, output and temporaries) a moment
  // after marking it complete. Waiting for that here frees them at the wait, where the simulator frees
  // them, not at a moment that depends on thread timing (it moved a stage-2 peak by a whole bucket
  // from run to run). Bounded: a reference kept longer is left to its owner. (NCCL's watchdog keeps
  // its references for its own period; that memory is the caching allocator's.)
  if (comm_->backend() != "gloo") return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  for (const auto& h : handed_) {
    while (h.use_count() > 1 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  }
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                     int rank, int world_size,
                                                     const C10dOptions& options) {
  TORCH_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " outside [0, ", world_size, ")");
  try {
    auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
    if (!options.interface.empty()) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(options.interface));
    } else if (!options.hostname.empty()) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname));
    } else {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    opts->threads = options.gloo_threads;
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, opts);
    // Gloo in torch 2.x has no ReduceOp::AVG for all reduction ops: sum, then divide.
    auto make_group = [store, options](const std::string& prefix, int r, int n) {
      return make_gloo_communicator(c10::make_intrusive<c10d::PrefixStore>(prefix, store), r, n, options);
    };
    return std::make_unique<C10dCommunicator>(std::move(pg), "gloo", rank, world_size, options,
                                              /*native_avg=*/false, make_group);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {}: gloo process group of {} ranks could not form: {}", rank,
                                world_size, detail::first_line(e.what())));
  }
}

bool have_nccl() { return ZEROPLAN_HAVE_NCCL != 0; }

std::unique_ptr<Communicator> make_nccl_communicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                     int rank, int world_size,
                                                     const C10dOptions& options) {
#if ZEROPLAN_HAVE_NCCL
  TORCH_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " outside [0, ", world_size, ")");
  try {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = options.timeout;
    c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(options.cuda_device));
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, opts);
    pg->setBoundDeviceId(device);
    auto make_group = [store, options](const std::string& prefix, int r, int n) {
      return make_nccl_communicator(c10::make_intrusive<c10d::PrefixStore>(prefix, store), r, n, options);
    };
    return std::make_unique<C10dCommunicator>(std::move(pg), "nccl", rank, world_size, options,
                                              /*native_avg=*/true, make_group);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {}: nccl process group of {} ranks could not form: {}", rank,
                                world_size, detail::first_line(e.what())));
  }
#else
  (void)store;
  (void)options;
  throw CommError(fmt::format(
      "rank {}: this zeroplan was built without NCCL; rebuild with the CUDA toolkit and the CUDA "
      "torch wheel (ZEROPLAN_WITH_NCCL=ON) or use gloo ({} ranks)",
      rank, world_size));
#endif
}

}  // namespace zeroplan::exec
