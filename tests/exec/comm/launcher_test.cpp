// Multi-process tests: real ranks of exec_rank_helper on 127.0.0.1, started by launch_local or by
// torchrun from the pinned wheel, compared against the single-process expectation.
#include <zeroplan/exec/launcher.h>
#include <zeroplan/exec/shm_communicator.h>
#include "comm_test_util.h"

#include <zeroplan/config.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace zeroplan::exec {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr auto kTestTimeout = std::chrono::seconds(30);

std::string helper() {
  return (fs::read_symlink("/proc/self/exe").parent_path() / "exec_rank_helper").string();
}

std::string fresh_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() / fmt::format("zeroplan_{}_{}", name, getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

LaunchOptions test_options(const std::string& name) {
  LaunchOptions o;
  o.executable = helper();
  o.timeout = kTestTimeout;
  o.output_dir = fresh_dir(name);
  o.capture_output = true;
  return o;
}

nlohmann::json result_of(const std::string& dir, int rank) {
  std::ifstream in(rank_file(dir, rank, ".json"));
  EXPECT_TRUE(in.good()) << rank_file(dir, rank, ".json");
  return in ? nlohmann::json::parse(in) : nlohmann::json{};
}

std::string log_of(const LaunchResult& r, int rank) {
  std::ifstream in(r.ranks.at(rank).log_path);
  return {std::istreambuf_iterator<char>(in), {}};
}

using commtest::input;
using commtest::values;

// What two ranks must compute, from one process.
void expect_collectives(const nlohmann::json& got, int r) {
  for (int64_t n : {1, 7, 1000}) {
    auto sum = input(0, n) + input(1, n);
    EXPECT_EQ(got[fmt::format("all_reduce_sum_{}", n)].get<std::vector<float>>(), values(sum)) << n;
    EXPECT_EQ(got[fmt::format("all_reduce_avg_{}", n)].get<std::vector<float>>(), values(sum / 2)) << n;
    EXPECT_EQ(got[fmt::format("all_gather_{}", n)].get<std::vector<float>>(),
              values(torch::cat({input(0, n), input(1, n)})))
        << n;
    auto full = input(0, 2 * n) + input(1, 2 * n);
    auto chunk = full.slice(0, r * n, (r + 1) * n);
    EXPECT_EQ(got[fmt::format("reduce_scatter_sum_{}", n)].get<std::vector<float>>(), values(chunk)) << n;
    EXPECT_EQ(got[fmt::format("reduce_scatter_avg_{}", n)].get<std::vector<float>>(), values(chunk / 2)) << n;
    EXPECT_EQ(got[fmt::format("broadcast_{}", n)].get<std::vector<float>>(), values(input(1, n))) << n;
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(got[fmt::format("in_flight_{}", i)].get<std::vector<float>>(),
              values(input(0, 33 + i) + input(1, 33 + i)));
  }
  EXPECT_EQ(got["counts"]["all_reduce"], 3 * 2 + 4);
  EXPECT_EQ(got["counts"]["all_gather"], 3);
  EXPECT_EQ(got["counts"]["reduce_scatter"], 6);
  EXPECT_EQ(got["counts"]["broadcast"], 3);
  EXPECT_EQ(got["counts"]["barrier"], 1);
}

TEST(LaunchLocal, CollectivesOnTwoRanksMatchTheSingleProcess) {
  auto o = test_options("collectives");
  auto r = launch_local(2, {"exec_rank_helper", "collectives"}, o);
  ASSERT_EQ(r.exit_code, 0) << r.message << "\n" << log_of(r, 0) << log_of(r, 1);
  EXPECT_EQ(r.message, "");
  for (int rank = 0; rank < 2; ++rank) {
    auto got = result_of(r.output_dir, rank);
    EXPECT_EQ(got["rank"], rank);
    EXPECT_EQ(got["launcher"], "zeroplan");
    EXPECT_EQ(got["agent_store"], true);
    EXPECT_EQ(got["backend"], cpu_backend(true));  // "shm": both ranks on this machine
    expect_collectives(got, rank);
    auto fb = got["fallbacks"].dump();
    EXPECT_EQ(fb.find("reduce_scatter via all_reduce"), std::string::npos) << fb;  // Gloo's is a ring
  }
  fs::remove_all(r.output_dir);
}

TEST(LaunchLocal, CollectivesWithADelayInjectedOnOneRank) {
  auto o = test_options("delay");
  o.env.push_back({"ZEROPLAN_TEST_DELAY_US", "20000"});
  auto start = Clock::now();
  auto r = launch_local(2, {"exec_rank_helper", "collectives"}, o);
  ASSERT_EQ(r.exit_code, 0) << r.message;
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(23 * 20));  // 23 collectives delayed
  for (int rank = 0; rank < 2; ++rank) expect_collectives(result_of(r.output_dir, rank), rank);
  fs::remove_all(r.output_dir);
}

TEST(LaunchLocal, ExactMicroCase) {
  auto o = test_options("micro");
  auto r = launch_local(2, {"exec_rank_helper", "micro"}, o);
  ASSERT_EQ(r.exit_code, 0) << r.message;
  for (int rank = 0; rank < 2; ++rank) {
    auto got = result_of(r.output_dir, rank);
    EXPECT_FLOAT_EQ(got["w"].get<float>(), 0.75f);
    EXPECT_FLOAT_EQ(got["b"].get<float>(), 1.85f);
  }
  fs::remove_all(r.output_dir);
}

TEST(LaunchLocal, AKilledRankEndsTheRunWithOneLineNamingIt) {
  auto o = test_options("die");
  auto start = Clock::now();
  auto r = launch_local(2, {"exec_rank_helper", "die"}, o);
  EXPECT_LT(Clock::now() - start, kTestTimeout);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.message, "rank 1 exited with signal 9 (killed) at step 3");
  // The survivor stopped by itself, with its own clear error naming the dead rank.
  EXPECT_FALSE(r.ranks[0].stopped_by_launcher);
  EXPECT_EQ(r.ranks[0].exit_code, 3) << log_of(r, 0);
  EXPECT_NE(r.ranks[0].error.find("rank 0: " + cpu_backend(true) + " all_reduce"), std::string::npos) << r.ranks[0].error;
  EXPECT_NE(r.ranks[0].error.find("rank 1 (last at step 3) died or hung"), std::string::npos)
      << r.ranks[0].error;
  fs::remove_all(r.output_dir);
}

TEST(LaunchLocal, ARankThatFailsOnItsOwnIsNamedWithItsError) {
  auto o = test_options("fail");
  auto r = launch_local(2, {"exec_rank_helper", "fail"}, o);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.message, "rank 1 exited with code 1 at step 2: loss is NaN at step 2 (injected)");
  EXPECT_NE(r.ranks[0].error.find("rank 1 failed: loss is NaN"), std::string::npos) << r.ranks[0].error;
  fs::remove_all(r.output_dir);
}

TEST(LaunchLocal, AHungRankIsKilledAndNamedWithinTheTimeout) {
  auto o = test_options("hang");
  o.timeout = std::chrono::seconds(10);
  auto start = Clock::now();
  auto r = launch_local(2, {"exec_rank_helper", "hang"}, o);
  EXPECT_LT(Clock::now() - start, o.timeout + std::chrono::seconds(5));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.message.rfind("rank 1 stopped responding at step 3: no heartbeat for ", 0), 0u) << r.message;
  EXPECT_NE(r.message.find("; stopped all 2 ranks"), std::string::npos) << r.message;
  fs::remove_all(r.output_dir);
}

TEST(LaunchLocal, NoSuchExecutableIsALaunchError) {
  LaunchOptions o;
  o.executable = "/nonexistent/zeroplan";
  EXPECT_THROW(launch_local(2, {"zeroplan"}, o), LaunchError);
  EXPECT_THROW(launch_local(0, {"zeroplan"}, {}), LaunchError);
}

// torchrun from the pinned wheel serves the store itself (TORCHELASTIC_USE_AGENT_STORE=True): the
// ranks must join it under /worker/attempt_0 instead of opening a second server on MASTER_PORT.
// torchrun hands "--master-port 0" to the ranks as is, so pick a free port (bind, read, close).
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

int run_torchrun(const std::string& dir, const std::string& mode, std::string* output) {
  auto cmd = fmt::format(
      "ZEROPLAN_OUTPUT_DIR={0} timeout 120 {1}/.venv/bin/torchrun --no-python --nproc-per-node 2 "
      "--master-addr 127.0.0.1 --master-port {4} {2} {3} > {0}/torchrun.log 2>&1",
      dir, ZEROPLAN_SOURCE_DIR, helper(), mode, free_port());
  int status = std::system(cmd.c_str());
  std::ifstream in(dir + "/torchrun.log");
  *output = {std::istreambuf_iterator<char>(in), {}};
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Torchrun, NoPythonLaunchJoinsTheAgentStore) {
  auto dir = fresh_dir("torchrun");
  std::string log;
  ASSERT_EQ(run_torchrun(dir, "collectives", &log), 0) << log;
  for (int rank = 0; rank < 2; ++rank) {
    auto got = result_of(dir, rank);
    EXPECT_EQ(got["launcher"], "torchrun");
    EXPECT_EQ(got["agent_store"], true);
    expect_collectives(got, rank);
  }
  fs::remove_all(dir);
}

TEST(Torchrun, AFailedRanksErrorFileReachesTorchrun) {
  auto dir = fresh_dir("torchrun_fail");
  std::string log;
  EXPECT_NE(run_torchrun(dir, "fail", &log), 0);
  // torchrun names rank 1 as the root cause, with the message from the error file it wrote (rank 0,
  // failing because of rank 1, holds back so the agent sees rank 1 first).
  auto root = log.find("Root Cause");
  ASSERT_NE(root, std::string::npos) << log;
  EXPECT_NE(log.find("rank      : 1", root), std::string::npos) << log.substr(root);
  EXPECT_NE(log.find("traceback : loss is NaN at step 2 (injected)", root), std::string::npos)
      << log.substr(root);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zeroplan::exec
