// exec_rank_helper: one rank of the multi-process communicator tests, started by launch_local or
// torchrun. Joins the group from the environment, runs one scenario (argv[1]) and writes
// <ZEROPLAN_OUTPUT_DIR>/rank<r>.json. Exit codes: 0 ok, 3 CommError (a peer failed), 1 other error.
//   collectives  all_reduce/all_gather/reduce_scatter/broadcast on rank-dependent inputs
//   micro        Linear(1,1) w=1 b=2, input rank+1, gradients averaged, SGD lr 0.1
//   die          steps of all_reduce; rank 1 sends itself SIGKILL at step 3
//   hang         steps of all_reduce; rank 1 stops itself (SIGSTOP) at step 3
//   fail         rank 1 throws an error of its own at step 2 (error file, exit 1)
// ZEROPLAN_TEST_DELAY_US=<us> wraps the communicator in a CountingCommunicator with that delay on
// rank 1; the counts are written either way.
#include <zeroplan/exec/counting_communicator.h>
#include "comm_test_util.h"
#include <zeroplan/exec/launcher.h>
#include <zeroplan/exec/rendezvous.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

using namespace zeroplan::exec;

namespace {

using zeroplan::exec::commtest::input;
using zeroplan::exec::commtest::values;

void collectives(Communicator& comm, nlohmann::json& out) {
  const int r = comm.rank(), w = comm.world_size();
  for (int64_t n : {1, 7, 1000}) {
    auto sum = input(r, n);
    comm.all_reduce(sum, ReduceOp::kSum)->wait();
    out[fmt::format("all_reduce_sum_{}", n)] = values(sum);
    auto avg = input(r, n);
    comm.all_reduce(avg, ReduceOp::kAvg)->wait();
    out[fmt::format("all_reduce_avg_{}", n)] = values(avg);
    auto gathered = torch::empty({n * w});
    comm.all_gather(gathered, input(r, n))->wait();
    out[fmt::format("all_gather_{}", n)] = values(gathered);
    auto rs_in = input(r, n * w);
    auto rs_sum = torch::empty({n});
    comm.reduce_scatter(rs_sum, rs_in, ReduceOp::kSum)->wait();
    out[fmt::format("reduce_scatter_sum_{}", n)] = values(rs_sum);
    auto rs_avg = torch::empty({n});
    comm.reduce_scatter(rs_avg, rs_in, ReduceOp::kAvg)->wait();
    out[fmt::format("reduce_scatter_avg_{}", n)] = values(rs_avg);
    auto b = input(r, n);
    comm.broadcast(b, w - 1)->wait();
    out[fmt::format("broadcast_{}", n)] = values(b);
  }
  // Several collectives in flight at once, waited in reverse order.
  std::vector<torch::Tensor> ts;
  std::vector<std::unique_ptr<Work>> works;
  for (int i = 0; i < 4; ++i) {
    ts.push_back(input(r, 33 + i));
    works.push_back(comm.all_reduce(ts.back(), ReduceOp::kSum));
  }
  for (int i = 3; i >= 0; --i) works[i]->wait();
  for (int i = 0; i < 4; ++i) out[fmt::format("in_flight_{}", i)] = values(ts[i]);
  comm.barrier();
}

void micro(Communicator& comm, nlohmann::json& out) {
  torch::manual_seed(0);
  torch::nn::Linear m(1, 1);
  {
    torch::NoGradGuard g;
    m->weight.fill_(1.0f);
    m->bias.fill_(2.0f);
  }
  torch::optim::SGD sgd(m->parameters(), torch::optim::SGDOptions(0.1));
  auto x = torch::full({1}, static_cast<float>(comm.rank() + 1));
  auto y = m->forward(x);
  y.backward(x);
  for (auto& p : m->parameters()) {
    auto g = p.grad();
    comm.all_reduce(g, ReduceOp::kAvg)->wait();
  }
  sgd.step();
  out["w"] = m->weight.item<float>();
  out["b"] = m->bias.item<float>();
}

void steps(RankSession& s, Communicator& comm, const std::string& mode) {
  for (int step = 0; step < 300; ++step) {
    s.set_step(step);
    if (comm.rank() == 1 && step == 3 && mode == "die") raise(SIGKILL);
    if (comm.rank() == 1 && step == 3 && mode == "hang") raise(SIGSTOP);
    if (comm.rank() == 1 && step == 2 && mode == "fail") {
      throw std::runtime_error("loss is NaN at step 2 (injected)");
    }
    auto t = torch::ones({1000});
    comm.all_reduce(t, ReduceOp::kSum)->wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  throw std::runtime_error("the failure was never detected");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  RankContext ctx;
  std::unique_ptr<RankSession> session;
  int code = 0;
  std::string error;
  try {
    ctx = rank_context_from_env();
    session = join(ctx);
    Communicator* comm = &session->comm();
    std::unique_ptr<CountingCommunicator> counting;
    const char* delay = std::getenv("ZEROPLAN_TEST_DELAY_US");
    counting = std::make_unique<CountingCommunicator>(
        *comm, std::chrono::microseconds(delay != nullptr && ctx.rank == 1 ? std::atoll(delay) : 0));
    comm = counting.get();

    nlohmann::json out;
    out["rank"] = ctx.rank;
    out["world_size"] = ctx.world_size;
    out["launcher"] = ctx.launcher;
    out["agent_store"] = ctx.agent_store;
    out["backend"] = comm->backend();
    if (mode == "collectives") {
      collectives(*comm, out);
    } else if (mode == "micro") {
      micro(*comm, out);
    } else {
      steps(*session, *comm, mode);
    }
    auto c = counting->counts();
    out["counts"] = {{"all_reduce", c.all_reduce}, {"all_gather", c.all_gather},
                     {"reduce_scatter", c.reduce_scatter}, {"broadcast", c.broadcast},
                     {"barrier", c.barrier}, {"bytes", c.bytes()}};
    out["fallbacks"] = comm->fallbacks();
    if (!ctx.output_dir.empty()) {
      std::ofstream(rank_file(ctx.output_dir, ctx.rank, ".json")) << out.dump(1);
    }
    session->finish();
    return 0;
  } catch (const CommError& e) {
    code = 3;
    error = e.what();
  } catch (const std::exception& e) {
    code = 1;
    error = e.what();
  }
  std::fprintf(stderr, "exec_rank_helper: %s\n", error.c_str());
  if (session) {
    session->fail(error);
  } else {
    write_error_file(ctx.error_file, error);
  }
  return code;
}
