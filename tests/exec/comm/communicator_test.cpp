// Communicators in one process: LocalCommunicator, CountingCommunicator, and Gloo with two ranks on
// threads over a HashStore (the multi-process tests are in launcher_test.cpp).
#include <zeroplan/exec/c10d_communicator.h>
#include <zeroplan/exec/counting_communicator.h>
#include "comm_test_util.h"
#include <zeroplan/exec/local_communicator.h>
#include <zeroplan/exec/shm_communicator.h>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <functional>
#include <thread>

namespace zeroplan::exec {
namespace {

using commtest::input;

TEST(LocalCommunicator, CollectivesOfOneRankAreIdentities) {
  LocalCommunicator comm;
  EXPECT_EQ(comm.world_size(), 1);
  EXPECT_EQ(comm.backend(), "local");
  auto t = input(0, 5);
  comm.all_reduce(t, ReduceOp::kAvg)->wait();
  EXPECT_TRUE(t.equal(input(0, 5)));
  auto out = torch::zeros({5});
  comm.all_gather(out, input(0, 5))->wait();
  EXPECT_TRUE(out.equal(input(0, 5)));
  auto rs = torch::zeros({5});
  comm.reduce_scatter(rs, input(0, 5), ReduceOp::kSum)->wait();
  EXPECT_TRUE(rs.equal(input(0, 5)));
  comm.broadcast(t, 0)->wait();
  comm.barrier();
  EXPECT_TRUE(comm.fallbacks().empty());
  auto wrong = torch::zeros({6});
  EXPECT_THROW(comm.all_gather(wrong, input(0, 5)), c10::Error);
}

TEST(CountingCommunicator, CountsCallsAndBytesLikeNcclTests) {
  CountingCommunicator comm(std::make_unique<LocalCommunicator>());
  auto t = torch::zeros({10});        // 40 bytes
  auto big = torch::zeros({10});
  comm.all_reduce(t, ReduceOp::kSum)->wait();
  comm.all_reduce(t, ReduceOp::kAvg)->wait();
  comm.all_gather(big, t)->wait();
  comm.reduce_scatter(t, big, ReduceOp::kSum)->wait();
  comm.broadcast(t, 0)->wait();
  comm.barrier();
  auto c = comm.counts();
  EXPECT_EQ(c.all_reduce, 2);
  EXPECT_EQ(c.all_gather, 1);
  EXPECT_EQ(c.reduce_scatter, 1);
  EXPECT_EQ(c.broadcast, 1);
  EXPECT_EQ(c.barrier, 1);
  EXPECT_EQ(c.calls(), 6);
  EXPECT_EQ(c.bytes_all_reduce, 80);
  EXPECT_EQ(c.bytes(), 80 + 40 + 40 + 40);
  ASSERT_EQ(comm.calls().size(), 6u);
  EXPECT_EQ(comm.calls()[2].kind, Collective::kAllGather);
  EXPECT_STREQ(to_string(comm.calls()[3].kind), "reduce_scatter");
  comm.reset();
  EXPECT_EQ(comm.counts().calls(), 0);
}

// Point to point (pipeline stages): a local communicator sends to itself, in order per tag; the counting
// one counts sends and receives apart from the collectives.
TEST(LocalCommunicator, SendsToItselfInOrderPerTag) {
  LocalCommunicator local;
  CountingCommunicator comm(local);
  comm.send(input(0, 3), 0, 7)->wait();
  comm.send(input(1, 3), 0, 7)->wait();
  comm.send(input(2, 5), 0, 8)->wait();
  auto a = torch::empty({5});
  comm.recv(a, 0, 8)->wait();
  EXPECT_TRUE(a.equal(input(2, 5)));
  auto b = torch::empty({3});
  comm.recv(b, 0, 7)->wait();
  EXPECT_TRUE(b.equal(input(0, 3)));
  comm.recv(b, 0, 7)->wait();
  EXPECT_TRUE(b.equal(input(1, 3)));
  EXPECT_THROW(comm.recv(b, 0, 7), CommError);  // nothing sent: it would wait forever
  EXPECT_THROW(comm.send(b, 1, 7), CommError);   // no rank 1
  const CollectiveCounts c = comm.counts();
  EXPECT_EQ(c.send, 4);  // counted as issued, the refused one too (as collectives are)
  EXPECT_EQ(c.recv, 4);
  EXPECT_EQ(c.bytes_send, 12 + 12 + 20 + 12);
  EXPECT_EQ(c.calls(), 0);  // point to point is not a collective
}

TEST(CountingCommunicator, DelaysEveryCollective) {
  LocalCommunicator local;
  CountingCommunicator comm(local, std::chrono::milliseconds(20));
  auto t = torch::zeros({4});
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) comm.all_reduce(t, ReduceOp::kSum)->wait();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  comm.set_delay({});
  start = std::chrono::steady_clock::now();
  comm.all_reduce(t, ReduceOp::kSum)->wait();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(20));
}

// Runs body(comm) on `n` Gloo ranks, one thread each, and returns what each rank's body threw.
std::vector<std::string> on_gloo_ranks(int n, const std::function<void(Communicator&)>& body,
                                       std::chrono::milliseconds timeout = std::chrono::seconds(30),
                                       std::function<std::string()> diagnose = {}) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        C10dOptions o;
        o.timeout = timeout;
        o.diagnose = diagnose;
        auto comm = make_gloo_communicator(store, r, n, o);
        body(*comm);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}
std::vector<std::string> on_two_gloo_ranks(const std::function<void(Communicator&)>& body,
                                           std::chrono::milliseconds timeout = std::chrono::seconds(30),
                                           std::function<std::string()> diagnose = {}) {
  return on_gloo_ranks(2, body, timeout, std::move(diagnose));
}

// Gloo's reduce-scatter is a ring of send/recv steps: on 2 ranks it equals the all-reduce path (the input
// all-reduced, this rank's chunk taken) bit for bit on random floats; on 3 and 4 ranks (another order of
// summation) bit for bit on sums that are exact and within rounding otherwise. Each rank sends (N-1)/N of
// the buffer, where the all-reduce sent 2(N-1)/N; no fallback is reported; the average divides.
TEST(GlooCommunicator, ReduceScatterIsARingThatEqualsTheAllReducePath) {
  for (const int n : {2, 3, 4}) {
    auto errors = on_gloo_ranks(n, [n](Communicator& comm) {
      const int r = comm.rank();
      std::int64_t expected_sent = 0;
      for (const std::int64_t chunk : {1, 5, 1000, 40000}) {
        for (const bool exact : {false, true}) {
          auto mine = exact ? torch::randint(-50, 50, {n * chunk}, torch::TensorOptions().dtype(torch::kFloat))
                                  .add_(static_cast<double>(r))
                            : input(r, n * chunk);
          auto reference = mine.clone();
          comm.all_reduce(reference, ReduceOp::kSum)->wait();
          auto out = torch::empty({chunk});
          comm.reduce_scatter(out, mine, ReduceOp::kSum)->wait();
          const auto want = reference.narrow(0, r * chunk, chunk);
          if (n == 2 || exact) {
            EXPECT_TRUE(out.equal(want)) << n << " ranks, chunk " << chunk << (exact ? " exact" : "");
          } else {
            EXPECT_TRUE(out.allclose(want, 1e-6, 1e-6)) << n << " ranks, chunk " << chunk;
          }
          expected_sent += (n - 1) * chunk * 4;
          EXPECT_EQ(comm.ring_bytes_sent(), expected_sent) << n << " ranks, chunk " << chunk;
        }
      }
      auto avg = torch::empty({7});
      auto x = input(r, n * 7), sum = x.clone();
      comm.all_reduce(sum, ReduceOp::kSum)->wait();
      comm.reduce_scatter(avg, x, ReduceOp::kAvg)->wait();
      EXPECT_TRUE(avg.allclose(sum.narrow(0, r * 7, 7) / n));
      // Two in flight at once (the executor waits on the first later), then both waited in order.
      auto a = torch::empty({3}), b = torch::empty({3});
      auto xa = input(r, n * 3), xb = input(r + 10, n * 3);
      auto wa = comm.reduce_scatter(a, xa, ReduceOp::kSum);
      auto wb = comm.reduce_scatter(b, xb, ReduceOp::kSum);
      wa->wait();
      wb->wait();
      auto sa = xa.clone(), sb = xb.clone();
      comm.all_reduce(sa, ReduceOp::kSum)->wait();
      comm.all_reduce(sb, ReduceOp::kSum)->wait();
      EXPECT_TRUE(a.allclose(sa.narrow(0, r * 3, 3)));
      EXPECT_TRUE(b.allclose(sb.narrow(0, r * 3, 3)));
      for (const auto& f : comm.fallbacks()) EXPECT_EQ(f.find("reduce_scatter via"), std::string::npos) << f;
    });
    EXPECT_EQ(errors, std::vector<std::string>(static_cast<std::size_t>(n), "")) << n << " ranks";
  }
}

TEST(GlooCommunicator, MatchesTheSingleProcessReductionOnUnevenSizes) {
  auto errors = on_two_gloo_ranks([](Communicator& comm) {
    const int r = comm.rank();
    EXPECT_EQ(comm.backend(), "gloo");
    for (int64_t n : {1, 3, 7, 1001}) {
      auto expect_sum = input(0, n) + input(1, n);
      auto t = input(r, n);
      comm.all_reduce(t, ReduceOp::kSum)->wait();
      EXPECT_TRUE(t.equal(expect_sum)) << n;
      auto a = input(r, n);
      comm.all_reduce(a, ReduceOp::kAvg)->wait();
      EXPECT_TRUE(a.allclose(expect_sum / 2)) << n;

      auto g = torch::empty({2 * n});
      comm.all_gather(g, input(r, n))->wait();
      EXPECT_TRUE(g.equal(torch::cat({input(0, n), input(1, n)}))) << n;

      auto full = input(0, 2 * n) + input(1, 2 * n);
      auto rs = torch::empty({n});
      comm.reduce_scatter(rs, input(r, 2 * n), ReduceOp::kSum)->wait();
      EXPECT_TRUE(rs.equal(full.slice(0, r * n, (r + 1) * n))) << n;
      auto rsa = torch::empty({n});
      comm.reduce_scatter(rsa, input(r, 2 * n), ReduceOp::kAvg)->wait();
      EXPECT_TRUE(rsa.allclose(full.slice(0, r * n, (r + 1) * n) / 2)) << n;

      auto b = input(r, n);
      comm.broadcast(b, 1)->wait();
      EXPECT_TRUE(b.equal(input(1, n))) << n;
    }
    // In-place all-gather (the executor's stages 1-2): the input is this rank's chunk of the output.
    auto whole = torch::zeros({8});
    whole.narrow(0, r * 4, 4).copy_(input(r, 4));
    auto mine = whole.narrow(0, r * 4, 4);
    comm.all_gather(whole, mine)->wait();
    EXPECT_TRUE(whole.equal(torch::cat({input(0, 4), input(1, 4)})));
    // Views of a larger flat buffer (the executor's flat parameters) work in place.
    auto flat = input(r, 10);
    auto view = flat.narrow(0, 2, 4);
    comm.all_reduce(view, ReduceOp::kSum)->wait();
    EXPECT_TRUE(flat.narrow(0, 2, 4).equal((input(0, 10) + input(1, 10)).narrow(0, 2, 4)));
    EXPECT_TRUE(flat.narrow(0, 0, 2).equal(input(r, 10).narrow(0, 0, 2)));
    comm.barrier();

    auto fb = comm.fallbacks();
    auto has = [&](const std::string& s) {
      return std::any_of(fb.begin(), fb.end(), [&](const auto& f) { return f.find(s) != std::string::npos; });
    };
    EXPECT_FALSE(has("gloo reduce_scatter via all_reduce")) << fb.size();  // a ring now, not a fallback
    EXPECT_TRUE(has("gloo all_reduce avg via sum then divide"));
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// Gloo send/recv between two ranks, both directions at once with different tags (a pipeline's activations
// forward and gradients back), in order per tag.
TEST(GlooCommunicator, SendAndRecvBothWays) {
  auto errors = on_two_gloo_ranks([](Communicator& comm) {
    const int r = comm.rank(), peer = 1 - r;
    std::vector<std::unique_ptr<Work>> sends;
    std::vector<torch::Tensor> sent;
    for (int k = 0; k < 3; ++k) {
      sent.push_back(input(10 * r + k, 1000));
      sends.push_back(comm.send(sent.back(), peer, r == 0 ? 1 : 2));
    }
    for (int k = 0; k < 3; ++k) {
      auto t = torch::empty({1000});
      comm.recv(t, peer, r == 0 ? 2 : 1)->wait();
      EXPECT_TRUE(t.equal(input(10 * peer + k, 1000))) << "rank " << r << " message " << k;
    }
    for (auto& w : sends) w->wait();
  });
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
}

TEST(GlooCommunicator, ExactMicroCase) {
  // Linear(1,1), w=1, b=2, input rank+1, y.backward(x), gradients averaged, SGD lr 0.1.
  std::vector<float> w(2), b(2);
  auto errors = on_two_gloo_ranks([&](Communicator& comm) {
    torch::nn::Linear m(1, 1);
    {
      torch::NoGradGuard g;
      m->weight.fill_(1.0f);
      m->bias.fill_(2.0f);
    }
    torch::optim::SGD sgd(m->parameters(), torch::optim::SGDOptions(0.1));
    auto x = torch::full({1}, static_cast<float>(comm.rank() + 1));
    m->forward(x).backward(x);
    for (auto& p : m->parameters()) {
      auto g = p.grad();
      comm.all_reduce(g, ReduceOp::kAvg)->wait();
    }
    sgd.step();
    w[comm.rank()] = m->weight.item<float>();
    b[comm.rank()] = m->bias.item<float>();
  });
  ASSERT_EQ(errors[0], "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_FLOAT_EQ(w[r], 0.75f);
    EXPECT_FLOAT_EQ(b[r], 1.85f);
  }
}

TEST(GlooCommunicator, ATimedOutCollectiveThrowsOneLineNamingTheRank) {
  auto start = std::chrono::steady_clock::now();
  auto errors = on_two_gloo_ranks(
      [](Communicator& comm) {
        if (comm.rank() == 1) {  // never joins the all_reduce
          std::this_thread::sleep_for(std::chrono::seconds(4));
          return;
        }
        auto t = torch::ones({8});
        comm.all_reduce(t, ReduceOp::kSum)->wait();
      },
      std::chrono::seconds(2), [] { return std::string("rank 1 died or hung"); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_NE(errors[0].find("rank 0: gloo all_reduce #1 (32 bytes) failed: rank 1 died or hung ("),
            std::string::npos)
      << errors[0];
  EXPECT_EQ(errors[0].find('\n'), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1], "");
}

// A ring reduce-scatter whose peer stops after the first one: the second's receive times out, and wait()
// throws one line naming the collective, without a hang (the ring's thread ends at its timeout).
TEST(GlooCommunicator, ATimedOutRingReduceScatterThrowsOneLine) {
  auto start = std::chrono::steady_clock::now();
  auto errors = on_two_gloo_ranks(
      [](Communicator& comm) {
        auto out = torch::empty({4});
        comm.reduce_scatter(out, torch::ones({8}), ReduceOp::kSum)->wait();  // both: the ring forms
        if (comm.rank() == 1) {  // never joins the second
          std::this_thread::sleep_for(std::chrono::seconds(4));
          return;
        }
        comm.reduce_scatter(out, torch::ones({8}), ReduceOp::kSum)->wait();
      },
      std::chrono::seconds(2), [] { return std::string("rank 1 died or hung"); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_NE(errors[0].find("rank 0: gloo reduce_scatter #2 (32 bytes) failed:"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[0].find('\n'), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1], "");
}

// Shared-memory collectives (shm_communicator.h) against Gloo's on the same ranks (a second process group
// of theirs underneath), with a staging area of 4 KB so that every collective runs in several rounds:
// all-gather and broadcast exact; on 2 ranks the sums bit for bit (a + b either way), on 3 within rounding
// of another order of summation and exact on integers; several collectives in flight complete in order;
// bf16; avg divides.
TEST(ShmCommunicator, CollectivesEqualGloosOnTwoAndThreeRanks) {
  for (const int n : {2, 3}) {
    auto errors = on_gloo_ranks(n, [n](Communicator& gloo) {
      const int r = gloo.rank();
      ShmOptions o;
      o.chunk_bytes = 4096;
      auto shm = make_shm_communicator(gloo.duplicate(), o);
      EXPECT_EQ(shm->world_size(), n);
      EXPECT_EQ(shm->rank(), r);
      torch::manual_seed(11 + r);
      const std::int64_t len = 10007;  // rounds of 1024 floats, then a short one
      const torch::Tensor x = torch::randn({n * len});
      const torch::Tensor ints = torch::randint(-1000, 1000, {n * len}).to(torch::kFloat);
      // all-reduce
      torch::Tensor a = x.clone(), b = x.clone(), ia = ints.clone(), ib = ints.clone();
      gloo.all_reduce(a, ReduceOp::kSum)->wait();
      auto w1 = shm->all_reduce(b, ReduceOp::kSum);
      auto w2 = shm->all_reduce(ib, ReduceOp::kSum);  // two in flight
      gloo.all_reduce(ia, ReduceOp::kSum)->wait();
      w1->wait();
      w2->wait();
      EXPECT_TRUE(ib.equal(ia)) << n;
      if (n == 2) {
        EXPECT_TRUE(b.equal(a));
      }
      EXPECT_TRUE(torch::allclose(b, a, 1e-5, 1e-5)) << n;
      // reduce-scatter
      torch::Tensor rs_g = torch::empty({len}), rs_s = torch::empty({len}), rs_i = torch::empty({len}), rs_gi = torch::empty({len});
      gloo.reduce_scatter(rs_g, x, ReduceOp::kSum)->wait();
      shm->reduce_scatter(rs_s, x, ReduceOp::kSum)->wait();
      gloo.reduce_scatter(rs_gi, ints, ReduceOp::kSum)->wait();
      shm->reduce_scatter(rs_i, ints, ReduceOp::kSum)->wait();
      EXPECT_TRUE(rs_i.equal(rs_gi)) << n;
      if (n == 2) {
        EXPECT_TRUE(rs_s.equal(rs_g));
      }
      EXPECT_TRUE(torch::allclose(rs_s, rs_g, 1e-5, 1e-5)) << n;
      torch::Tensor avg = torch::empty({len});
      shm->reduce_scatter(avg, ints, ReduceOp::kAvg)->wait();
      EXPECT_TRUE(avg.equal(rs_i / n)) << n;
      // all-gather, broadcast, bf16
      torch::Tensor ag_g = torch::empty({n * len}), ag_s = torch::empty({n * len});
      const torch::Tensor mine = x.narrow(0, 0, len).contiguous();
      gloo.all_gather(ag_g, mine)->wait();
      shm->all_gather(ag_s, mine)->wait();
      EXPECT_TRUE(ag_s.equal(ag_g)) << n;
      torch::Tensor bc = x.clone();
      shm->broadcast(bc, n - 1)->wait();
      torch::Tensor bc_g = x.clone();
      gloo.broadcast(bc_g, n - 1)->wait();
      EXPECT_TRUE(bc.equal(bc_g)) << n;
      torch::Tensor h = ints.to(torch::kBFloat16), hg = h.clone();
      shm->all_reduce(h, ReduceOp::kSum)->wait();
      gloo.all_reduce(hg, ReduceOp::kSum)->wait();
      if (n == 2) {
        EXPECT_TRUE(h.equal(hg));
      }
      shm->barrier();
      EXPECT_NE(shm->duplicate(), nullptr);
    });
    for (const auto& e : errors) EXPECT_EQ(e, "") << n << " ranks";
  }
}

// A segment /dev/shm cannot hold (an exabyte per rank): every rank keeps Gloo, which still works.
TEST(ShmCommunicator, FallsBackToGlooWhenSharedMemoryIsShort) {
  auto errors = on_two_gloo_ranks([](Communicator& gloo) {
    ShmOptions o;
    o.chunk_bytes = 1ll << 60;
    auto comm = make_shm_communicator(gloo.duplicate(), o);
    EXPECT_EQ(comm->backend(), "gloo");
    torch::Tensor t = torch::ones({10});
    comm->all_reduce(t, ReduceOp::kSum)->wait();
    EXPECT_TRUE(t.equal(torch::full({10}, 2.0f)));
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// A peer that never comes to a collective: the waiting rank fails in one line naming it, within the timeout.
TEST(ShmCommunicator, APeerThatNeverArrivesFailsInOneLine) {
  std::string failure;
  auto errors = on_two_gloo_ranks([&failure](Communicator& gloo) {
    ShmOptions o;
    o.timeout = std::chrono::milliseconds(1500);
    auto shm = make_shm_communicator(gloo.duplicate(), o);
    if (gloo.rank() == 1) return;  // leaves without the all-reduce
    torch::Tensor t = torch::ones({100});
    const auto start = std::chrono::steady_clock::now();
    try {
      shm->all_reduce(t, ReduceOp::kSum)->wait();
    } catch (const CommError& e) {
      failure = e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
    EXPECT_THROW(shm->all_reduce(t, ReduceOp::kSum)->wait(), CommError);  // the rounds no longer line up
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_NE(failure.find("rank 0: shm all_reduce #1 (400 bytes) failed: rank 1 did not arrive within 1500 ms"), std::string::npos)
      << failure;
  EXPECT_EQ(failure.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace zeroplan::exec
