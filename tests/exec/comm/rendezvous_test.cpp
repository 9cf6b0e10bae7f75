// The launch environment (torchrun, Slurm, zeroplan, explicit) and torchrun's error file.
#include <zeroplan/exec/launcher.h>
#include <zeroplan/exec/rendezvous.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sstream>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

namespace zeroplan::exec {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(RankContext, NoVariablesIsAWorldOfOne) {
  auto c = rank_context_from_env(env_of({}));
  EXPECT_EQ(c.rank, 0);
  EXPECT_EQ(c.world_size, 1);
  EXPECT_EQ(c.launcher, "single");
  EXPECT_FALSE(c.agent_store);
}

TEST(RankContext, TorchrunWithAgentStore) {
  auto c = rank_context_from_env(env_of({{"RANK", "3"},
                                         {"WORLD_SIZE", "4"},
                                         {"LOCAL_RANK", "1"},
                                         {"LOCAL_WORLD_SIZE", "2"},
                                         {"MASTER_ADDR", "10.0.0.7"},
                                         {"MASTER_PORT", "29731"},
                                         {"TORCHELASTIC_RUN_ID", "none"},
                                         {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                         {"TORCHELASTIC_RESTART_COUNT", "2"},
                                         {"TORCHELASTIC_ERROR_FILE", "/tmp/x/error.json"}}));
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.world_size, 4);
  EXPECT_EQ(c.local_rank, 1);
  EXPECT_EQ(c.local_world_size, 2);
  EXPECT_EQ(c.master_addr, "10.0.0.7");
  EXPECT_EQ(c.master_port, 29731);
  EXPECT_EQ(c.launcher, "torchrun");
  EXPECT_TRUE(c.agent_store);
  EXPECT_EQ(c.restart_count, 2);
  EXPECT_EQ(c.error_file, "/tmp/x/error.json");
}

TEST(RankContext, Slurm) {
  auto c = rank_context_from_env(env_of({{"SLURM_PROCID", "5"},
                                         {"SLURM_NTASKS", "8"},
                                         {"SLURM_LOCALID", "1"},
                                         {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                                         {"MASTER_ADDR", "node01"},
                                         {"MASTER_PORT", "12345"}}));
  EXPECT_EQ(c.launcher, "slurm");
  EXPECT_EQ(c.rank, 5);
  EXPECT_EQ(c.world_size, 8);
  EXPECT_EQ(c.local_rank, 1);
  EXPECT_EQ(c.local_world_size, 4);
  EXPECT_EQ(c.master_addr, "node01");
  EXPECT_FALSE(c.agent_store);
}

TEST(RankContext, ExplicitVariablesWithoutAgentStoreMakeRankZeroServe) {
  auto c = rank_context_from_env(
      env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}}));
  EXPECT_EQ(c.launcher, "env");
  EXPECT_FALSE(c.agent_store);
  EXPECT_EQ(c.local_world_size, 2);
}

TEST(RankContext, ErrorsNameTheVariable) {
  auto message = [](std::map<std::string, std::string> vars) {
    try {
      rank_context_from_env(env_of(std::move(vars)));
    } catch (const RendezvousError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({{"RANK", "x"}, {"WORLD_SIZE", "2"}}),
            "RANK='x' is not an integer in [0, 1048576]");
  EXPECT_EQ(message({{"RANK", "0"}}), "WORLD_SIZE is not set");
  EXPECT_EQ(message({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}), "rank 2 outside [0, 2)");
  EXPECT_NE(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).find("MASTER_ADDR is not set"), std::string::npos);
  EXPECT_NE(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})
                .find("MASTER_PORT='70000'"),
            std::string::npos);
  EXPECT_NE(message({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}).find("MASTER_ADDR is not set under Slurm"),
            std::string::npos);
}

// The job a rank belongs to: zeroplan's own id first, then torchrun's run id (not its default "none"),
// then Slurm's job id.
TEST(RankContext, JobId) {
  EXPECT_EQ(rank_context_from_env(env_of({})).job_id, "");
  EXPECT_EQ(rank_context_from_env(env_of({{"TORCHELASTIC_RUN_ID", "none"}})).job_id, "");
  EXPECT_EQ(rank_context_from_env(env_of({{"TORCHELASTIC_RUN_ID", "exp7"}})).job_id, "exp7");
  EXPECT_EQ(rank_context_from_env(env_of({{"SLURM_JOB_ID", "4242"}})).job_id, "4242");
  EXPECT_EQ(rank_context_from_env(env_of({{"ZEROPLAN_JOB_ID", "zp-1"}, {"SLURM_JOB_ID", "4242"}})).job_id, "zp-1");
}

// Two jobs on one port: job a's store (a real TCPStore on 127.0.0.1) is claimed by a; a rank of job a
// joins; a rank of job b that reaches it is refused at once with a line naming both jobs.
TEST(Join, ARankOfAnotherJobIsRefusedAtOnce) {
  c10d::TCPStoreOptions server;
  server.port = 0;
  server.isServer = true;
  server.waitWorkers = false;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server);
  RankContext a;
  a.master_port = static_cast<int>(store->getPort());
  a.job_id = "job-a";
  check_job(*store, a);  // claims it
  RankContext a1 = a;
  a1.rank = 1;
  EXPECT_NO_THROW(check_job(*store, a1));
  RankContext b = a1;
  b.job_id = "job-b";
  const auto t0 = std::chrono::steady_clock::now();
  try {
    check_job(*store, b);
    FAIL() << "a rank of job b joined job a's store";
  } catch (const RendezvousError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1 of job job-b"), std::string::npos) << what;
    EXPECT_NE(what.find("which job job-a holds: two jobs on one port"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  RankContext anonymous = b;
  anonymous.job_id.clear();
  EXPECT_NO_THROW(check_job(*store, anonymous));  // nothing to check against
}

// The local address a listening TCP socket on `port` is bound to, from /proc/net/tcp ("" if none).
std::string listening_address(int port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  const std::string want = fmt::format(":{:04X}", port);
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string slot, local, remote, state;
    f >> slot >> local >> remote >> state;
    if (state == "0A" && local.size() > 5 && local.substr(local.size() - 5) == want) return local.substr(0, 8);
  }
  return "";
}

// An env-launched job's rank 0 serves its store on MASTER_ADDR's address only (127.0.0.1 here), not on every
// interface as TCPStore binds by itself; a second job given the same port fails at once, in one line.
TEST(Join, RankZeroServesTheStoreOnMasterAddrOnly) {
  int port = 0;
  {
    c10d::TCPStoreOptions probe;  // a free port
    probe.port = 0;
    probe.isServer = true;
    probe.waitWorkers = false;
    port = static_cast<int>(c10::make_intrusive<c10d::TCPStore>("127.0.0.1", probe)->getPort());
  }
  RankContext ctx;
  ctx.rank = 0;
  ctx.world_size = 2;
  ctx.launcher = "env";
  ctx.master_addr = "127.0.0.1";
  ctx.master_port = port;
  auto store = connect_store(ctx, std::chrono::seconds(5));
  EXPECT_EQ(listening_address(port), "0100007F") << "port " << port;  // 127.0.0.1, not 00000000
  store->set("k", std::vector<std::uint8_t>{1});
  const auto t0 = std::chrono::steady_clock::now();
  try {
    connect_store(ctx, std::chrono::seconds(5));
    FAIL() << "a second rank 0 served the same port";
  } catch (const RendezvousError& e) {
    EXPECT_NE(std::string(e.what()).find("the port is in use"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
}

TEST(ErrorFile, HasTheLayoutTorchrunReads) {
  auto dir = std::filesystem::temp_directory_path() / "zeroplan_error_file_test";
  std::filesystem::create_directories(dir);
  auto path = (dir / "error.json").string();
  write_error_file(path, "rank 1: gloo all_reduce #3 failed: \"quoted\"");
  std::ifstream in(path);
  auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["message"]["message"], "rank 1: gloo all_reduce #3 failed: \"quoted\"");
  EXPECT_EQ(j["message"]["extraInfo"]["py_callstack"], j["message"]["message"]);
  auto ts = j["message"]["extraInfo"]["timestamp"].get<std::string>();
  EXPECT_GT(std::stoll(ts), 1600000000LL);
  write_error_file("", "nothing happens");  // no path: no file, no throw
  std::filesystem::remove_all(dir);
}

TEST(Launcher, WithoutOptionDropsTheLaunchersOwnArguments) {
  std::vector<std::string> argv{"zeroplan", "run", "--nproc", "2", "--plan", "p.json", "--nproc=4", "x"};
  EXPECT_EQ(without_option(argv, "--nproc"),
            (std::vector<std::string>{"zeroplan", "run", "--plan", "p.json", "x"}));
  EXPECT_EQ(rank_file("/d", 1, ".json"), "/d/rank1.json");
}

TEST(Join, AWorldOfOneNeedsNoNetwork) {
  RankContext c;
  auto s = join(c);
  EXPECT_EQ(s->comm().backend(), "local");
  EXPECT_EQ(s->comm().world_size(), 1);
  s->set_step(1);
  s->finish();
}

}  // namespace
}  // namespace zeroplan::exec
