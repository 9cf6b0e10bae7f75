// A rank's launch environment: torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...), or
// Slurm's, parsed and checked into a RankContext.
#include <zeroplan/exec/rendezvous.h>

#include <fmt/format.h>

#include <cstdlib>
#include <string>

namespace zeroplan::exec {

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
  c.secret = env("ZEROPLAN_JOB_SECRET").value_or("");
  c.output_dir = env("ZEROPLAN_OUTPUT_DIR").value_or("");
  if (env("ZEROPLAN_TIMEOUT_MS")) {
    c.timeout = std::chrono::milliseconds(parse_int(env, "ZEROPLAN_TIMEOUT_MS", 1, 1 << 30));
  }
  check_ranges(c);
  return c;
}

}  // namespace zeroplan::exec
