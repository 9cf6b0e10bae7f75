// Rendezvous: who this rank is (torchrun, Slurm, `zeroplan run --nproc`, or explicit values), the
// c10d store all ranks share, and the communicator over it.
//
// Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) and under zeroplan's own launcher, the store is
// already served on MASTER_ADDR:MASTER_PORT: ranks join it as clients under the prefix
// "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>". Otherwise rank 0 serves it. Each joined rank
// publishes a heartbeat and its current step in the store, so a peer that died or hung can be named
// (by the survivors' CommError and by the launcher) rather than waited on.
#pragma once

#include <zeroplan/exec/communicator.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace zeroplan::exec {

// The launch environment is missing or contradicts itself; what() names the variable.
class RendezvousError : public Error {
 public:
  explicit RendezvousError(const std::string& message) : Error(ErrorKind::bad_input, message) {}
};

struct RankContext {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // "torchrun", "slurm", "zeroplan" (launch_local), "env" (RANK/WORLD_SIZE set by hand), "single".
  std::string launcher = "single";
  // The store is served by the agent (torchrun or launch_local): join it under the attempt prefix.
  bool agent_store = false;
  int restart_count = 0;      // TORCHELASTIC_RESTART_COUNT
  std::string error_file;     // TORCHELASTIC_ERROR_FILE ("" = none)
  std::string output_dir;     // ZEROPLAN_OUTPUT_DIR: where launch_local gathers rank results
  std::optional<std::chrono::milliseconds> timeout;  // ZEROPLAN_TIMEOUT_MS, set by launch_local
  // Which job this rank belongs to: ZEROPLAN_JOB_ID (launch_local makes one), else torchrun's
  // TORCHELASTIC_RUN_ID (not its default "none"), else SLURM_JOB_ID; "" when none is known.
  std::string job_id;
  // ZEROPLAN_JOB_SECRET: seals the job's store (seal_store) and its claim (job_tag). launch_local makes one
  // per job; a job launched by hand sets the same value on every rank. Required when MASTER_ADDR is not a
  // loopback address (join refuses without it); on loopback its absence seals with the job id only.
  std::string secret;
};

using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Reads torchrun's, Slurm's or zeroplan's variables; a process with none is a world of one.
// Throws RendezvousError naming the variable that is malformed or out of range.
RankContext rank_context_from_env();
RankContext rank_context_from_env(const EnvLookup& env);  // for tests

struct RendezvousOptions {
  // Collective timeout; also how long to wait for the store and for every rank to arrive.
  // RankContext::timeout, when set, wins.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::string device = "cpu";  // "cpu": Gloo; "cuda": NCCL on device LOCAL_RANK
  // Gloo bind address; "" = 127.0.0.1 when MASTER_ADDR is loopback, else this machine's hostname.
  std::string hostname;
  std::chrono::milliseconds heartbeat_interval{1000};
};

// The store of this rank's group: a client of the agent's store under "/worker/attempt_<n>", or
// TCPStore served by rank 0. Throws RendezvousError when it cannot connect within `timeout`.
c10::intrusive_ptr<c10d::Store> connect_store(const RankContext& ctx,
                                              std::chrono::milliseconds timeout);

// Claims the store for this rank's job (key "zeroplan/job", compare-and-set): the first rank to join
// writes its job's tag (job_tag of its secret and job id: the key holds neither), later ranks must find
// the same. Throws RendezvousError when a rank of one job reached the store of another (two jobs given one
// MASTER_PORT) or runs with another ZEROPLAN_JOB_SECRET, at once rather than after the collective timeout.
// Nothing is checked when ctx.job_id and ctx.secret are both empty.
void check_job(c10d::Store& store, const RankContext& ctx);

// The job's store sealed with its secret (sealed_store.cpp): key names are HMACs under the secret, values
// encrypted and authenticated, so a process without the secret that reaches the port (TCPStore answers
// anyone, listKeys included) reads opaque names and ciphertext, and a value it writes is refused at the
// first read with a RendezvousError in one line.
c10::intrusive_ptr<c10d::Store> seal_store(c10::intrusive_ptr<c10d::Store> inner, const std::string& secret);
// The public tag of (secret, job id) that check_job claims the store with (reveals neither).
std::string job_tag(const std::string& secret, const std::string& job_id);
// 128 random bits as hex (std::random_device): launch_local's secret for each job.
std::string new_job_secret();
// The secret the store is sealed with: ctx.secret, or one derived from the job id when a loopback job has
// none. Throws RendezvousError when a job of several ranks reachable from other machines has none.
std::string job_secret(const RankContext& ctx);

// Store keys a rank publishes (under the store's prefix), read by launch_local and the diagnosis.
namespace store_keys {
std::string heartbeat(int rank);  // "<sequence> <step>", rewritten every heartbeat_interval
std::string failed(int rank);     // one-line error of a rank that failed on purpose
std::string done(int rank);       // the rank finished normally
}  // namespace store_keys

// What a joined rank holds for the run. Destroying it stops the heartbeat.
class RankSession {
 public:
  virtual ~RankSession() = default;
  virtual const RankContext& context() const = 0;
  virtual Communicator& comm() = 0;
  virtual c10::intrusive_ptr<c10d::Store> store() const = 0;
  // Published with the heartbeat; the launcher's failure line says "at step N".
  virtual void set_step(int64_t step) = 0;
  // Records a failure of this rank: the one-line message goes to the store (so peers and the
  // launcher can name it) and to TORCHELASTIC_ERROR_FILE.
  virtual void fail(const std::string& message) = 0;
  // Marks this rank as finished normally (peers then do not blame it for leaving).
  virtual void finish() = 0;
};

// Connects the store, forms the process group (Gloo or NCCL), starts the heartbeat.
// Throws RendezvousError (store) or CommError (process group) with one line.
std::unique_ptr<RankSession> join(const RankContext& ctx, const RendezvousOptions& options = {});

// Writes torchrun's error file: {"message": {"message": M, "extraInfo": {"py_callstack": M,
// "timestamp": "<unix seconds>"}}}. Does nothing when `path` is empty. Never throws.
void write_error_file(const std::string& path, const std::string& message);

}  // namespace zeroplan::exec
