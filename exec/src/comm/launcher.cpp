// launch_local: spawn, watch and stop the local ranks; serve their store.
#include <zeroplan/exec/launcher.h>

#include <zeroplan/exec/rendezvous.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "errors.h"
#include "launcher_os.h"

extern char** environ;

namespace zeroplan::exec {

std::vector<std::string> without_option(const std::vector<std::string>& argv,
                                        const std::string& name) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (i > 0 && argv[i] == name) {
      ++i;  // and its value
      continue;
    }
    if (i > 0 && argv[i].rfind(name + "=", 0) == 0) continue;
    out.push_back(argv[i]);
  }
  return out;
}

std::string rank_file(const std::string& dir, int rank, const std::string& suffix) {
  return fmt::format("{}/rank{}{}", dir, rank, suffix);
}

namespace {

using Clock = std::chrono::steady_clock;

struct Rank {
  RankExit exit;
  bool running = true;
  Clock::time_point ended;
  int64_t heartbeat_seq = -1;
  Clock::time_point heartbeat_changed;
  std::string error_file;
};

std::string signal_name(int sig) {
  const char* d = strsignal(sig);
  std::string s = d != nullptr ? d : "unknown";
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

std::string read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  try {
    auto j = nlohmann::json::parse(in);
    const auto& m = j.at("message");
    return m.is_string() ? m.get<std::string>() : m.at("message").get<std::string>();
  } catch (...) {
    return "";
  }
}

std::string store_get(c10d::Store& store, const std::string& key) {
  try {
    if (!store.check({key})) return "";
    auto v = store.get(key);
    return {v.begin(), v.end()};
  } catch (...) {
    return "";
  }
}

std::string at_step(int64_t step) { return step >= 0 ? fmt::format(" at step {}", step) : ""; }

std::string describe(const RankExit& r) {
  if (r.signal != 0) {
    return fmt::format("rank {} exited with signal {} ({}){}", r.rank, r.signal,
                       signal_name(r.signal), at_step(r.last_step));
  }
  return fmt::format("rank {} exited with code {}{}{}", r.rank, r.exit_code, at_step(r.last_step),
                     r.error.empty() ? "" : ": " + r.error);
}

std::string default_output_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = fmt::format("{}/zeroplan-run-XXXXXX", tmp != nullptr && *tmp ? tmp : "/tmp");
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    throw LaunchError(fmt::format("cannot create {}: {}", pattern, std::strerror(errno)));
  }
  return buf.data();
}

std::string self_executable() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw LaunchError("cannot read /proc/self/exe: " + ec.message());
  return p.string();
}

}  // namespace

LaunchResult launch_local(int nproc, const std::vector<std::string>& argv,
                          const LaunchOptions& options) {
  if (nproc < 1) throw LaunchError(fmt::format("--nproc {} < 1", nproc));
  if (argv.empty()) throw LaunchError("launch_local needs argv[0]");
  const std::string exe = options.executable.empty() ? self_executable() : options.executable;
  if (access(exe.c_str(), X_OK) != 0) throw LaunchError(fmt::format("cannot execute {}", exe));

  LaunchResult result;
  result.output_dir = options.output_dir.empty() ? default_output_dir() : options.output_dir;
  std::filesystem::create_directories(result.output_dir);
  if (options.output_dir.empty()) {
    // The folder the launcher made goes when the last copy of the result does (after the caller read
    // the ranks' files), whatever ended the run.
    result.cleanup = std::shared_ptr<void>(nullptr, [dir = result.output_dir](void*) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    });
  }

  // The agent store: served here, so it outlives any rank, and bound before the ranks start (no
  // race for the port).
  const int listen_fd = detail::loopback_listener();
  c10d::TCPStoreOptions sopts;
  sopts.port = static_cast<std::uint16_t>(detail::bound_port(listen_fd));
  sopts.masterListenFd = listen_fd;
  sopts.isServer = true;
  sopts.waitWorkers = false;
  sopts.timeout = options.timeout;
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  try {
    tcp = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", sopts);
  } catch (const std::exception& e) {
    ::close(listen_fd);
    throw LaunchError("cannot serve the store on 127.0.0.1: " + detail::first_line(e.what()));
  }
  const int port = tcp->getPort();
  auto attempt = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_0", tcp);
  // This job's id and secret: its tag claims the store before any rank joins (a rank of another job, or
  // one without this secret, that reaches this port is refused at once: check_job), and the ranks and this
  // launcher read and write the store sealed with the secret (seal_store).
  const std::string job_id = fmt::format("zeroplan-{}-{}", ::getpid(), new_job_secret().substr(0, 16));
  const std::string secret = new_job_secret();
  const std::string tag = job_tag(secret, job_id);
  attempt->set("zeroplan/job", std::vector<std::uint8_t>(tag.begin(), tag.end()));
  const auto sealed = seal_store(attempt, secret);
  c10d::Store& store = *sealed;

  // Environment: ours minus what we set, plus the rank's.
  static const char* kOwned[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                 "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_",
                                 "ZEROPLAN_LAUNCHER", "ZEROPLAN_LAUNCHER_PID", "ZEROPLAN_OUTPUT_DIR", "ZEROPLAN_TIMEOUT_MS", "ZEROPLAN_JOB_ID", "ZEROPLAN_JOB_SECRET",
                                 "SLURM_PROCID"};
  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    bool owned = false;
    for (const char* k : kOwned) {
      std::string key = k;
      owned = owned || (key.back() == '_' ? kv.rfind(key, 0) == 0 : kv.rfind(key + "=", 0) == 0);
    }
    if (!owned) base_env.push_back(kv);
  }
  for (const auto& [k, v] : options.env) base_env.push_back(k + "=" + v);

  std::vector<Rank> ranks(nproc);
  detail::StopSignals stop_signals;
  int stopped_by = 0;  // the signal the launcher was stopped with
  const auto start = Clock::now();
  auto stop_all = [&](int sig, bool by_launcher) {
    for (auto& r : ranks) {
      if (r.running) {
        kill(r.exit.pid, sig);
        if (by_launcher) r.exit.stopped_by_launcher = true;
      }
    }
  };

  for (int i = 0; i < nproc; ++i) {
    Rank& r = ranks[i];
    r.exit.rank = i;
    r.error_file = rank_file(result.output_dir, i, ".error.json");
    std::remove(r.error_file.c_str());
    std::vector<std::string> env = base_env;
    env.push_back(fmt::format("RANK={}", i));
    env.push_back(fmt::format("WORLD_SIZE={}", nproc));
    env.push_back(fmt::format("LOCAL_RANK={}", i));
    env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", nproc));
    env.push_back(fmt::format("GROUP_RANK=0"));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back(fmt::format("MASTER_PORT={}", port));
    env.push_back("TORCHELASTIC_USE_AGENT_STORE=True");
    env.push_back("TORCHELASTIC_RESTART_COUNT=0");
    env.push_back("TORCHELASTIC_ERROR_FILE=" + r.error_file);
    env.push_back("ZEROPLAN_LAUNCHER=zeroplan");
    env.push_back(fmt::format("ZEROPLAN_LAUNCHER_PID={}", ::getpid()));  // a rank that starts orphaned knows it
    env.push_back("ZEROPLAN_OUTPUT_DIR=" + result.output_dir);
    env.push_back(fmt::format("ZEROPLAN_TIMEOUT_MS={}", options.timeout.count()));
    env.push_back("ZEROPLAN_JOB_ID=" + job_id);
    env.push_back("ZEROPLAN_JOB_SECRET=" + secret);

    std::vector<char*> cargv, cenv;
    for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
    cenv.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (options.capture_output) {
      r.exit.log_path = rank_file(result.output_dir, i, ".log");
      posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, r.exit.log_path.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    }
    pid_t pid = 0;
    int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, cargv.data(), cenv.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      stop_all(SIGKILL, true);
      for (auto& s : ranks) {
        if (s.running && s.exit.pid > 0) waitpid(s.exit.pid, nullptr, 0);
      }
      throw LaunchError(fmt::format("cannot start rank {} ({}): {}", i, exe, std::strerror(rc)));
    }
    r.exit.pid = pid;
    r.heartbeat_changed = start;
  }

  std::optional<int> hung;           // rank declared hung by the launcher
  std::optional<Clock::time_point> first_failure, terminated;
  auto last_poll = start;
  int running = nproc;
  while (running > 0) {
    const auto now = Clock::now();
    for (auto& r : ranks) {
      if (!r.running) continue;
      int status = 0;
      pid_t got = waitpid(r.exit.pid, &status, WNOHANG);
      if (got != r.exit.pid) continue;
      r.running = false;
      r.ended = now;
      --running;
      if (WIFSIGNALED(status)) {
        r.exit.signal = WTERMSIG(status);
      } else {
        r.exit.exit_code = WEXITSTATUS(status);
      }
      bool failed = r.exit.signal != 0 || r.exit.exit_code != 0;
      if (failed && !r.exit.stopped_by_launcher && !first_failure) first_failure = now;
    }
    if (running == 0) break;

    if (now - last_poll >= std::chrono::milliseconds(250)) {
      last_poll = now;
      for (auto& r : ranks) {
        auto hb = store_get(store, store_keys::heartbeat(r.exit.rank));
        long long seq = -1, step = -1;
        if (!hb.empty() && std::sscanf(hb.c_str(), "%lld %lld", &seq, &step) == 2) {
          if (seq != r.heartbeat_seq) {
            r.heartbeat_seq = seq;
            r.heartbeat_changed = now;
          }
          r.exit.last_step = step;
        }
        if (!r.running || first_failure || hung) continue;
        auto limit = r.heartbeat_seq < 0 ? options.timeout : options.timeout / 2;
        if (now - r.heartbeat_changed > limit) {
          hung = r.exit.rank;
          first_failure = now;
          terminated = now;
          stop_all(SIGKILL, true);  // a hung rank ignores nothing but SIGKILL
          break;
        }
      }
    }
    if (const int sig = detail::stop_signal(); sig != 0 && stopped_by == 0) {
      stopped_by = sig;
      terminated = now;
      stop_all(SIGTERM, true);
    }
    if (first_failure && !terminated && now - *first_failure > options.failure_grace) {
      terminated = now;
      stop_all(SIGTERM, true);
    }
    if (terminated && now - *terminated > options.kill_grace) stop_all(SIGKILL, true);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  for (auto& r : ranks) {
    auto hb = store_get(store, store_keys::heartbeat(r.exit.rank));
    long long seq = -1, step = -1;
    if (!hb.empty() && std::sscanf(hb.c_str(), "%lld %lld", &seq, &step) == 2) r.exit.last_step = step;
    r.exit.error = read_error_file(r.error_file);
    if (r.exit.error.empty()) r.exit.error = store_get(store, store_keys::failed(r.exit.rank));
    result.ranks.push_back(r.exit);
  }

  if (stopped_by != 0) {
    result.exit_code = 128 + stopped_by;
    const char* abbrev = sigabbrev_np(stopped_by);
    const std::string sig = abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", stopped_by);
    result.message = fmt::format("stopped by {}: the {} ranks were stopped", sig, nproc);
    return result;
  }
  if (hung) {
    const auto& r = ranks[*hung];
    result.exit_code = kRankFailedExitCode;
    result.message = fmt::format(
        "rank {} stopped responding{}: no heartbeat for {:.0f} s; stopped all {} ranks", *hung,
        at_step(r.exit.last_step),
        std::chrono::duration<double>(Clock::now() - r.heartbeat_changed).count(), nproc);
    return result;
  }
  // The root cause is the first rank that failed by itself. A rank that wrote its own failure (the
  // store's failed key) says why; one that exits with the dead-rank code (3) is usually reporting a
  // peer, and one killed by a signal right after a peer left (SIGPIPE on the peer's closed socket) is
  // too: the rank with a message wins, then one that died otherwise than with code 3, then the earliest.
  auto rank_of = [](const Rank& r) {
    if (!r.exit.error.empty() && r.exit.exit_code != kRankFailedExitCode) return 2;
    return (r.exit.signal != 0 || r.exit.exit_code != kRankFailedExitCode) ? 1 : 0;
  };
  const Rank* primary = nullptr;
  for (const auto& r : ranks) {
    bool failed = r.exit.signal != 0 || r.exit.exit_code != 0;
    if (!failed || r.exit.stopped_by_launcher) continue;
    if (primary == nullptr || rank_of(r) > rank_of(*primary) ||
        (rank_of(r) == rank_of(*primary) && r.ended < primary->ended)) {
      primary = &r;
    }
  }
  if (primary == nullptr) {
    for (const auto& r : ranks) {
      if (r.exit.signal != 0 || r.exit.exit_code != 0) {
        primary = &r;
        break;
      }
    }
  }
  if (primary != nullptr) {
    result.exit_code = kRankFailedExitCode;
    result.message = describe(primary->exit);
  }
  return result;
}

}  // namespace zeroplan::exec
