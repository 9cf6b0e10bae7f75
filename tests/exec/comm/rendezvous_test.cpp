// The launch environment (torchrun, Slurm, zeroplan, explicit) and torchrun's error file.
#include <zeroplan/exec/launcher.h>
#include <zeroplan/exec/rendezvous.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sstream>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

namespace zeroplan::exec {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// A port no one listens on now (a store served on port 0 reports the one it got, then closes).
int unused_port() {
  c10d::TCPStoreOptions probe;
  probe.port = 0;
  probe.isServer = true;
  probe.waitWorkers = false;
  return static_cast<int>(c10::make_intrusive<c10d::TCPStore>("127.0.0.1", probe)->getPort());
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
// joins; a rank of job b that reaches it, or a rank of job a with another secret, is refused at once in
// one line; the claim's value names neither job nor secret.
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
    EXPECT_NE(what.find("which another job holds, or a rank with another ZEROPLAN_JOB_SECRET: two jobs on one port"),
              std::string::npos) << what;
    EXPECT_EQ(what.find("job-a"), std::string::npos) << "the store's claim names job a: " << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  auto claim = store->get("zeroplan/job");
  EXPECT_EQ(std::string(claim.begin(), claim.end()).find("job-a"), std::string::npos);
  RankContext other_secret = a1;
  other_secret.secret = "not-job-a's";
  EXPECT_THROW(check_job(*store, other_secret), RendezvousError);
  RankContext anonymous = b;
  anonymous.job_id.clear();
  EXPECT_NO_THROW(check_job(*store, anonymous));  // nothing to check against
}

// A sealed store: what it writes reads back, the inner store holds no name or value in the clear, equal
// values seal alike (compareSet works), counters add; a value written by anyone else, or read with another
// secret, is refused in one line.
TEST(SealedStore, HidesNamesAndValuesAndRefusesForeignWrites) {
  auto inner = c10::make_intrusive<c10d::HashStore>();
  auto sealed = seal_store(inner, "s3cret");
  const std::string text = "127.0.0.1:29500 rank 0 address";
  sealed->set("gloo/rank0", std::vector<uint8_t>(text.begin(), text.end()));
  auto back = sealed->get("gloo/rank0");
  EXPECT_EQ(std::string(back.begin(), back.end()), text);
  for (const std::string& key : inner->listKeys()) {
    EXPECT_EQ(key.find("gloo"), std::string::npos) << key;
    auto v = inner->get(key);
    EXPECT_EQ(std::string(v.begin(), v.end()).find("127.0.0.1"), std::string::npos);
  }
  EXPECT_EQ(sealed->add("count", 2), 2);
  EXPECT_EQ(sealed->add("count", 3), 5);
  auto count = sealed->get("count");
  EXPECT_EQ(std::string(count.begin(), count.end()), "5");
  const std::vector<uint8_t> one{'1'}, two{'2'};
  EXPECT_EQ(sealed->compareSet("claim", {}, one), one);
  EXPECT_EQ(sealed->compareSet("claim", two, two), one);  // not the expected value: unchanged
  EXPECT_EQ(sealed->compareSet("claim", one, two), two);
  EXPECT_TRUE(sealed->check({"gloo/rank0", "claim"}));
  EXPECT_FALSE(sealed->check({"nothing"}));

  // Another secret reads nothing of it; a foreign value under the sealed name is refused in one line.
  auto other = seal_store(inner, "guess");
  EXPECT_FALSE(other->check({"gloo/rank0"}));
  const auto names = inner->listKeys();
  for (const auto& key : names) inner->set(key, std::vector<uint8_t>{'x'});
  try {
    sealed->get("gloo/rank0");
    FAIL() << "a foreign value was read";
  } catch (const RendezvousError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("\"gloo/rank0\" was not written by this job"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// A running job's store (two ranks joined on 127.0.0.1, rank 0 serving it) seen by a raw TCPStore client
// that has its port but not its secret: every key it lists is an opaque name (the claim aside) with sealed
// bytes, no value holds the job id, the secret or an address; a rank it starts with the job's id but
// another secret is refused at once; a value it writes over the job's keys is refused at the next read.
TEST(Join, ARawClientNeitherReadsTheStoreNorJoins) {
  const int port = unused_port();
  auto ctx_of = [&](int rank, const std::string& secret) {
    RankContext c;
    c.rank = rank;
    c.world_size = 2;
    c.launcher = "env";
    c.master_addr = "127.0.0.1";
    c.master_port = port;
    c.job_id = "job-raw";
    c.secret = secret;
    return c;
  };
  RendezvousOptions opts;
  opts.timeout = std::chrono::seconds(20);
  opts.heartbeat_interval = std::chrono::milliseconds(100);
  std::unique_ptr<RankSession> s0, s1;
  std::thread t0([&] { s0 = join(ctx_of(0, "0123456789abcdef"), opts); });
  std::thread t1([&] { s1 = join(ctx_of(1, "0123456789abcdef"), opts); });
  t0.join();
  t1.join();
  ASSERT_TRUE(s0 && s1);
  s0->set_step(7);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // heartbeats written

  c10d::TCPStoreOptions copts;
  copts.port = static_cast<std::uint16_t>(port);
  copts.isServer = false;
  copts.timeout = std::chrono::seconds(5);
  c10d::TCPStore raw("127.0.0.1", copts);
  const auto keys = raw.listKeys();
  ASSERT_GT(keys.size(), 3u);
  for (const std::string& key : keys) {
    auto v = raw.get(key);
    const std::string value(v.begin(), v.end());
    if (key == "zeroplan/job") {
      EXPECT_EQ(value.find("job-raw"), std::string::npos);
      continue;
    }
    EXPECT_EQ(key.rfind("zp/", 0), 0u) << "a key in the clear: " << key;
    EXPECT_EQ(value.rfind("zps1", 0), 0u) << key << " holds a value in the clear";
    for (const char* secret_text : {"job-raw", "0123456789abcdef", "127.0.0.1"})
      EXPECT_EQ(value.find(secret_text), std::string::npos) << key << " shows " << secret_text;
  }

  const auto start = std::chrono::steady_clock::now();
  try {
    join(ctx_of(1, "a-guessed-secret"), opts);
    FAIL() << "a rank without the job's secret joined";
  } catch (const RendezvousError& e) {
    EXPECT_NE(std::string(e.what()).find("ZEROPLAN_JOB_SECRET"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));

  s0->finish();
  s1->finish();
  for (const std::string& key : keys)
    if (key != "zeroplan/job") raw.set(key, std::vector<uint8_t>{'0'});
  EXPECT_THROW(s0->store()->get(store_keys::heartbeat(1)), RendezvousError);
  s0.reset();
  s1.reset();
}

// A job whose store other machines can reach does not start without a secret: one line naming the variable.
TEST(Join, ANonLoopbackJobNeedsASecret) {
  RankContext c;
  c.rank = 1;
  c.world_size = 2;
  c.launcher = "env";
  c.master_addr = "10.1.2.3";
  try {
    job_secret(c);
    FAIL() << "no secret asked for";
  } catch (const RendezvousError& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR 10.1.2.3 is reachable from other machines and "
                                         "ZEROPLAN_JOB_SECRET is not set"), std::string::npos) << e.what();
  }
  c.secret = "set";
  EXPECT_EQ(job_secret(c), "set");
  c.secret.clear();
  c.master_addr = "127.0.0.1";
  EXPECT_NO_THROW(job_secret(c));
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
  const int port = unused_port();
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
