// `zeroplan run --nproc N`: start N local ranks of a program on 127.0.0.1, watch them, and gather
// their results, the way torchrun's agent does. The launcher serves the store itself (so ranks join
// it exactly as under torchrun: TORCHELASTIC_USE_AGENT_STORE, prefix "/worker/attempt_0"), gives each
// rank RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_ERROR_FILE, ZEROPLAN_OUTPUT_DIR and ZEROPLAN_TIMEOUT_MS, and never hangs: a rank that
// dies ends the run, a rank without a heartbeat for timeout/2 (timeout before its first) is declared
// hung, and the rest are stopped (SIGTERM, then SIGKILL). The store listens on 127.0.0.1 only. SIGTERM,
// SIGINT or SIGHUP to the launcher stops the ranks the same way; a folder it made is removed with the
// result.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>

#include "zeroplan/profiles/errors.h"
#include <string>
#include <utility>
#include <vector>

namespace zeroplan::exec {

// Exit code of launch_local when a rank failed, died or hung (the CLI's "dead rank" code).
inline constexpr int kRankFailedExitCode = 3;

struct LaunchOptions {
  std::string executable;  // "" = this program (/proc/self/exe)
  // The ranks' collective timeout; also bounds how long a silent rank is waited on.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // After the first rank fails, survivors get this long to stop by themselves (their own CommError
  // names the failed rank) before the launcher terminates them.
  std::chrono::milliseconds failure_grace{std::chrono::seconds(10)};
  std::chrono::milliseconds kill_grace{std::chrono::seconds(3)};  // SIGTERM, then SIGKILL
  std::string output_dir;       // "" = a fresh directory under $TMPDIR
  bool capture_output = false;  // rank stdout+stderr to <output_dir>/rank<r>.log
  std::vector<std::pair<std::string, std::string>> env;  // extra variables for every rank
};

struct RankExit {
  int rank = 0;
  int pid = 0;
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  bool stopped_by_launcher = false;
  int64_t last_step = -1;  // from the rank's heartbeat; -1 = unknown
  std::string error;       // from the rank's error file or the store, one line
  std::string log_path;    // when capture_output
};

struct LaunchResult {
  int exit_code = 0;    // 0, kRankFailedExitCode, or 128 + the signal (SIGTERM, SIGINT, SIGHUP) that
                        // stopped the launcher: it sent SIGTERM to the ranks, then SIGKILL after kill_grace
  std::string message;  // one line naming the rank that failed first, e.g.
                        // "rank 1 exited with signal 9 (killed) at step 3"; "" on success
  std::vector<RankExit> ranks;
  std::string output_dir;  // where the ranks wrote their results (rank_file())
  // When the launcher made output_dir: removes it once the last copy of this result is gone.
  std::shared_ptr<void> cleanup;
};

// Could not start at all (no such executable, no free port); rank failures are in LaunchResult.
class LaunchError : public Error {
 public:
  explicit LaunchError(const std::string& message) : Error(ErrorKind::run_failed, message) {}
};

// REQUIRES: nproc >= 1; argv[0] is the program name the ranks see, argv[1..] their arguments.
LaunchResult launch_local(int nproc, const std::vector<std::string>& argv,
                          const LaunchOptions& options = {});

// argv without "--name VALUE" and "--name=VALUE" (e.g. the parent's "--nproc 2").
std::vector<std::string> without_option(const std::vector<std::string>& argv, const std::string& name);

// "<dir>/rank<r><suffix>": where rank r writes a result for the launcher to gather.
std::string rank_file(const std::string& dir, int rank, const std::string& suffix);

}  // namespace zeroplan::exec
