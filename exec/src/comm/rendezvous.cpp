// Store, process group and heartbeat of one rank (its launch environment: rank_env.cpp).
#include <zeroplan/exec/rendezvous.h>
#include <zeroplan/exec/shm_communicator.h>

#include <zeroplan/exec/c10d_communicator.h>
#include <zeroplan/exec/local_communicator.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "errors.h"

namespace zeroplan::exec {

namespace store_keys {
std::string heartbeat(int rank) { return fmt::format("zeroplan/heartbeat/{}", rank); }
std::string failed(int rank) { return fmt::format("zeroplan/failed/{}", rank); }
std::string done(int rank) { return fmt::format("zeroplan/done/{}", rank); }
}  // namespace store_keys

namespace {

bool is_loopback(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr == "localhost" || addr == "::1";
}

// Rank 0's store socket, bound to MASTER_ADDR's own address (127.0.0.1 for a job on one machine) rather
// than every interface, as TCPStore binds by itself: a job reachable only where its ranks reach it.
// -1 when MASTER_ADDR is not an IPv4 address of this machine (a name that resolves elsewhere, IPv6):
// TCPStore then binds as it does. Throws RendezvousError when the port is taken (another job on it).
int store_listener(const std::string& addr, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(addr.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return -1;
  sockaddr_in a = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EADDRINUSE) {
      throw RendezvousError(fmt::format("rank 0: cannot serve the store at {}:{}: the port is in use (another job "
                                        "on MASTER_PORT {}? give each job its own)", addr, port, port));
    }
    return -1;  // not an address of this machine: TCPStore's own binding
  }
  if (::listen(fd, SOMAXCONN) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::string job_secret(const RankContext& ctx) {
  if (!ctx.secret.empty()) return ctx.secret;
  if (ctx.world_size > 1 && !is_loopback(ctx.master_addr)) {
    throw RendezvousError(fmt::format(
        "rank {}: MASTER_ADDR {} is reachable from other machines and ZEROPLAN_JOB_SECRET is not set: set it to one "
        "random value for every rank of the job (export ZEROPLAN_JOB_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d "
        "' \\n')), so that only this job's ranks can read or write its store",
        ctx.rank, ctx.master_addr));
  }
  return "job:" + ctx.job_id;  // loopback: only this machine reaches the store
}

c10::intrusive_ptr<c10d::Store> connect_store(const RankContext& ctx,
                                              std::chrono::milliseconds timeout) {
  if (ctx.world_size == 1 && !ctx.agent_store) return c10::make_intrusive<c10d::HashStore>();
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(ctx.master_port);
  opts.isServer = !ctx.agent_store && ctx.rank == 0;
  opts.numWorkers = ctx.agent_store ? std::nullopt : std::optional<std::size_t>(ctx.world_size);
  opts.waitWorkers = false;
  opts.timeout = timeout;
  int listen_fd = -1;
  if (opts.isServer) {
    listen_fd = store_listener(ctx.master_addr, ctx.master_port);
    if (listen_fd >= 0) opts.masterListenFd = listen_fd;
  }
  try {
    auto tcp = c10::make_intrusive<c10d::TCPStore>(ctx.master_addr, opts);
    if (!ctx.agent_store) return tcp;
    return c10::make_intrusive<c10d::PrefixStore>(
        fmt::format("/worker/attempt_{}", ctx.restart_count), tcp);
  } catch (const std::exception& e) {
    if (listen_fd >= 0) ::close(listen_fd);
    throw RendezvousError(fmt::format(
        "rank {}: cannot {} the store at {}:{} ({}): {}", ctx.rank,
        opts.isServer ? "serve" : "reach", ctx.master_addr, ctx.master_port,
        ctx.agent_store ? "agent store" : (opts.isServer ? "rank 0 serves it" : "served by rank 0"),
        detail::first_line(e.what())));
  }
}

void write_error_file(const std::string& path, const std::string& message) {
  if (path.empty()) return;
  try {
    nlohmann::json j;
    j["message"]["message"] = message;
    j["message"]["extraInfo"]["py_callstack"] = message;
    j["message"]["extraInfo"]["timestamp"] = std::to_string(static_cast<long long>(std::time(nullptr)));
    std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << j.dump();
      if (!out) return;
    }
    std::rename(tmp.c_str(), path.c_str());
  } catch (...) {
  }
}

namespace {

// Publishes this rank's heartbeat and step; names dead, hung or failed peers after a failure.
class Monitor {
 public:
  Monitor(c10::intrusive_ptr<c10d::Store> store, RankContext ctx, std::chrono::milliseconds interval)
      : store_(std::move(store)), ctx_(std::move(ctx)), interval_(interval) {}

  ~Monitor() { stop(); }

  // The heartbeat thread also watches the agent's store: a rank whose agent store (served by its launcher:
  // torchrun, zeroplan run) is gone for two heartbeats in a row lost its launcher, and so its job. It ends
  // at once with one line, before it could write a checkpoint into a folder a restarted job may be using
  // (issue #37: orphans kept training and saving). PR_SET_PDEATHSIG covers a rank whose parent is the
  // launcher; this covers the rest (a launcher that is not the parent). A store served by rank 0 is left
  // to the collectives: rank 0 leaving it may be the end of the job.
  void start() {
    beat();
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mutex_);
      int failures = 0;
      while (!cv_.wait_for(lock, interval_, [this] { return stopping_; })) {
        lock.unlock();
        failures = beat() ? 0 : failures + 1;
        lock.lock();
        if (failures > 0 && !ctx_.agent_store) break;  // rank 0's store: a collective will say so
        if (failures >= 2 && !stopping_ && !finished_.load()) {
          std::fprintf(stderr, "rank %d: the store at %s:%d is gone, so its launcher (torchrun or zeroplan run) died: "
                       "this rank stops (no checkpoint is written after it)\n", ctx_.rank, ctx_.master_addr.c_str(),
                       ctx_.master_port);
          std::fflush(stderr);
          std::_Exit(3);
        }
      }
    });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // The rank finished normally: peers do not blame it, and a store gone from now on (rank 0 done and gone)
  // does not end this rank.
  void finished() {
    finished_.store(true);
    put(store_keys::done(ctx_.rank), "1");
  }

  // Published at once, so a rank that dies right after is reported at the right step.
  // The last diagnosis named a peer that failed, died or hung first.
  bool blamed_peer() const { return blamed_peer_.load(); }

  void set_step(int64_t step) {
    step_.store(step);
    beat();
  }

  void put(const std::string& key, const std::string& value) {
    try {
      store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
    } catch (const std::exception&) {
    }
  }

  std::string diagnose() {
    try {
      auto before = heartbeats();
      if (auto f = failed_peer(); !f.empty()) return f;
      // Give live peers a few heartbeats to show they are alive.
      auto deadline = std::chrono::steady_clock::now() + 3 * interval_ + std::chrono::milliseconds(500);
      while (std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        if (auto f = failed_peer(); !f.empty()) return f;
      }
      auto after = heartbeats();
      std::vector<std::string> silent;
      for (int r = 0; r < ctx_.world_size; ++r) {
        if (r == ctx_.rank || has(store_keys::done(r))) continue;
        if (before[r].first == after[r].first) {
          silent.push_back(after[r].second >= 0
                               ? fmt::format("rank {} (last at step {})", r, after[r].second)
                               : fmt::format("rank {}", r));
        }
      }
      if (silent.empty()) return "";
      blamed_peer_ = true;
      return fmt::format("{} died or hung: no heartbeat for {:.1f} s", fmt::join(silent, ", "),
                         std::chrono::duration<double>(3 * interval_).count() + 0.5);
    } catch (const std::exception&) {
      return fmt::format("the store at {}:{} is gone, so {} died", ctx_.master_addr,
                         ctx_.master_port,
                         ctx_.agent_store ? "the launcher (torchrun or zeroplan run)"
                                          : "rank 0, which served it,");
    }
  }

 private:
  bool beat() {
    try {
      put_or_throw(store_keys::heartbeat(ctx_.rank), fmt::format("{} {}", ++sequence_, step_.load()));
      return true;
    } catch (const std::exception&) {
      return false;  // the store is gone; a collective will say so
    }
  }

  void put_or_throw(const std::string& key, const std::string& value) {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }

  bool has(const std::string& key) { return store_->check({key}); }

  std::string get(const std::string& key) {
    auto v = store_->get(key);
    return {v.begin(), v.end()};
  }

  std::string failed_peer() {
    for (int r = 0; r < ctx_.world_size; ++r) {
      if (r != ctx_.rank && has(store_keys::failed(r))) {
        blamed_peer_ = true;
        return fmt::format("rank {} failed: {}", r, get(store_keys::failed(r)));
      }
    }
    return "";
  }

  // rank -> (sequence, step); (-1, -1) before the first heartbeat.
  std::vector<std::pair<int64_t, int64_t>> heartbeats() {
    std::vector<std::pair<int64_t, int64_t>> out(ctx_.world_size, {-1, -1});
    for (int r = 0; r < ctx_.world_size; ++r) {
      if (r == ctx_.rank || !has(store_keys::heartbeat(r))) continue;
      long long seq = -1, step = -1;
      if (std::sscanf(get(store_keys::heartbeat(r)).c_str(), "%lld %lld", &seq, &step) == 2) {
        out[r] = {seq, step};
      }
    }
    return out;
  }

  c10::intrusive_ptr<c10d::Store> store_;
  RankContext ctx_;
  std::chrono::milliseconds interval_;
  std::atomic<int64_t> step_{-1};
  std::atomic<bool> blamed_peer_{false};
  std::atomic<bool> finished_{false};
  std::atomic<int64_t> sequence_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

class Session final : public RankSession {
 public:
  Session(RankContext ctx, c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<Monitor> monitor)
      : ctx_(std::move(ctx)), store_(std::move(store)), monitor_(std::move(monitor)) {}
  ~Session() override {
    comm_.reset();
    if (monitor_) monitor_->stop();
  }

  const RankContext& context() const override { return ctx_; }
  Communicator& comm() override { return *comm_; }
  c10::intrusive_ptr<c10d::Store> store() const override { return store_; }
  void set_step(int64_t step) override {
    if (monitor_) monitor_->set_step(step);
  }
  void fail(const std::string& message) override {
    if (monitor_) monitor_->put(store_keys::failed(ctx_.rank), message);
    // torchrun reports the failure with the earliest error-file timestamp (whole seconds) as the
    // root cause. A rank failing because of a peer holds back, so the agent sees the peer's failure
    // first and stops this rank, instead of a tie that may name the wrong rank.
    if (monitor_ && monitor_->blamed_peer() && ctx_.launcher == "torchrun") {
      std::this_thread::sleep_for(std::chrono::seconds(3));
    }
    write_error_file(ctx_.error_file, message);
  }
  void finish() override {
    if (monitor_) monitor_->finished();
  }

  std::unique_ptr<Communicator> comm_;

 private:
  RankContext ctx_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::shared_ptr<Monitor> monitor_;
};

}  // namespace

std::unique_ptr<RankSession> join(const RankContext& ctx, const RendezvousOptions& options) {
  auto timeout = ctx.timeout.value_or(options.timeout);
  const std::string secret = job_secret(ctx);  // before anything is bound or reached
  auto store = connect_store(ctx, timeout);
  check_job(*store, ctx);
  store = seal_store(store, secret);
  std::shared_ptr<Monitor> monitor;
  if (ctx.world_size > 1 || ctx.agent_store) {
    monitor = std::make_shared<Monitor>(store, ctx, options.heartbeat_interval);
    monitor->start();
  }
  auto session = std::make_unique<Session>(ctx, store, monitor);
  if (ctx.world_size == 1) {
    session->comm_ = std::make_unique<LocalCommunicator>();
    return session;
  }
  C10dOptions copts;
  copts.timeout = timeout;
  copts.hostname = options.hostname;
  if (copts.hostname.empty()) copts.hostname = is_loopback(ctx.master_addr) ? "127.0.0.1" : "";
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname) {
    copts.interface = ifname;
  }
  copts.cuda_device = ctx.local_rank;
  std::weak_ptr<Monitor> weak = monitor;
  copts.diagnose = [weak]() -> std::string {
    auto m = weak.lock();
    return m ? m->diagnose() : "";
  };
  if (options.device == "cpu") {
    session->comm_ = make_gloo_communicator(store, ctx.rank, ctx.world_size, copts);
    if (cpu_backend(ctx.local_world_size == ctx.world_size) == "shm") {
      ShmOptions so;
      so.timeout = timeout;
      so.diagnose = copts.diagnose;
      session->comm_ = make_shm_communicator(std::move(session->comm_), so);
    }
  } else if (options.device == "cuda") {
    session->comm_ = make_nccl_communicator(store, ctx.rank, ctx.world_size, copts);
  } else {
    throw RendezvousError(fmt::format("unknown device '{}' (cpu or cuda)", options.device));
  }
  return session;
}

}  // namespace zeroplan::exec
