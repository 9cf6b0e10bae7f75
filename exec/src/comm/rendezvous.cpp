// Launch environment, store, process group and heartbeat of one rank.
#include <zeroplan/exec/rendezvous.h>

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

int parse_int(const EnvLookup& env, const std::string& name, int lo, int hi) {
  auto value = env(name);
  if (!value) throw RendezvousError(fmt::format("{} is not set", name));
  try {
    size_t used = 0;
    long v = std::stol(*value, &used);
    if (used != value->size() || v < lo || v > hi) throw std::out_of_range(name);
    return static_cast<int>(v);
  } catch (const std::exception&) {
    throw RendezvousError(
        fmt::format("{}='{}' is not an integer in [{}, {}]", name, *value, lo, hi));
  }
}

int parse_int_or(const EnvLookup& env, const std::string& name, int lo, int hi, int fallback) {
  return env(name) ? parse_int(env, name, lo, hi) : fallback;
}

// Slurm's per-node task counts look like "2(x3),1"; the first entry is this node's on uniform runs.
int slurm_tasks_per_node(const std::string& value) {
  try {
    return std::stoi(value);
  } catch (const std::exception&) {
    return 1;
  }
}

bool is_loopback(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr == "localhost" || addr == "::1";
}

void check_ranges(const RankContext& c) {
  if (c.world_size < 1) throw RendezvousError(fmt::format("world size {} < 1", c.world_size));
  if (c.rank < 0 || c.rank >= c.world_size) {
    throw RendezvousError(fmt::format("rank {} outside [0, {})", c.rank, c.world_size));
  }
  if (c.local_rank < 0 || c.local_rank >= c.local_world_size) {
    throw RendezvousError(
        fmt::format("local rank {} outside [0, {})", c.local_rank, c.local_world_size));
  }
}

}  // namespace

RankContext rank_context_from_env() {
  return rank_context_from_env([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  });
}

RankContext rank_context_from_env(const EnvLookup& env) {
  RankContext c;
  const int kMax = 1 << 20;
  // The rendezvous address, which every launcher passes the same way; `missing` says how to set it.
  auto master = [&](const std::string& missing) {
    if (c.world_size > 1 && !env("MASTER_ADDR")) throw RendezvousError(missing);
    c.master_addr = env("MASTER_ADDR").value_or("127.0.0.1");
    c.master_port = parse_int_or(env, "MASTER_PORT", 1, 65535, 29500);
  };
  if (env("RANK") || env("WORLD_SIZE")) {
    c.rank = parse_int(env, "RANK", 0, kMax);
    c.world_size = parse_int(env, "WORLD_SIZE", 1, kMax);
    c.local_rank = parse_int_or(env, "LOCAL_RANK", 0, kMax, c.rank);
    c.local_world_size = parse_int_or(env, "LOCAL_WORLD_SIZE", 1, kMax, c.world_size);
    bool elastic = env("TORCHELASTIC_RUN_ID") || env("TORCHELASTIC_USE_AGENT_STORE") ||
                   env("TORCHELASTIC_RESTART_COUNT") || env("GROUP_RANK");
    auto launcher = env("ZEROPLAN_LAUNCHER");
    c.launcher = launcher ? *launcher : (elastic ? "torchrun" : "env");
    master(fmt::format("MASTER_ADDR is not set (RANK={} WORLD_SIZE={}): set MASTER_ADDR and MASTER_PORT, or "
                       "launch with torchrun or `zeroplan run --nproc`",
                       c.rank, c.world_size));
    auto agent = env("TORCHELASTIC_USE_AGENT_STORE");
    c.agent_store = agent && (*agent == "True" || *agent == "true" || *agent == "1");
    c.restart_count = parse_int_or(env, "TORCHELASTIC_RESTART_COUNT", 0, kMax, 0);
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    c.launcher = "slurm";
    c.rank = parse_int(env, "SLURM_PROCID", 0, kMax);
    c.world_size = parse_int(env, "SLURM_NTASKS", 1, kMax);
    c.local_rank = parse_int_or(env, "SLURM_LOCALID", 0, kMax, 0);
    auto per_node = env("SLURM_NTASKS_PER_NODE");
    if (!per_node) per_node = env("SLURM_TASKS_PER_NODE");
    c.local_world_size = per_node ? slurm_tasks_per_node(*per_node) : c.world_size;
    if (c.local_rank >= c.local_world_size) c.local_world_size = c.local_rank + 1;
    master(fmt::format("MASTER_ADDR is not set under Slurm (SLURM_PROCID={} SLURM_NTASKS={}): export "
                       "MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1) and MASTER_PORT",
                       c.rank, c.world_size));
  }
  c.error_file = env("TORCHELASTIC_ERROR_FILE").value_or("");
  if (auto id = env("ZEROPLAN_JOB_ID")) c.job_id = *id;
  else if (auto run = env("TORCHELASTIC_RUN_ID"); run && *run != "none") c.job_id = *run;
  else if (auto slurm = env("SLURM_JOB_ID")) c.job_id = *slurm;
  c.output_dir = env("ZEROPLAN_OUTPUT_DIR").value_or("");
  if (env("ZEROPLAN_TIMEOUT_MS")) {
    c.timeout = std::chrono::milliseconds(parse_int(env, "ZEROPLAN_TIMEOUT_MS", 1, 1 << 30));
  }
  check_ranges(c);
  return c;
}

namespace {

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

  void start() {
    beat();
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!cv_.wait_for(lock, interval_, [this] { return stopping_; })) {
        lock.unlock();
        bool ok = beat();
        lock.lock();
        if (!ok) break;
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
    if (monitor_) monitor_->put(store_keys::done(ctx_.rank), "1");
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
  auto store = connect_store(ctx, timeout);
  check_job(*store, ctx);
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
  } else if (options.device == "cuda") {
    session->comm_ = make_nccl_communicator(store, ctx.rank, ctx.world_size, copts);
  } else {
    throw RendezvousError(fmt::format("unknown device '{}' (cpu or cuda)", options.device));
  }
  return session;
}

}  // namespace zeroplan::exec
