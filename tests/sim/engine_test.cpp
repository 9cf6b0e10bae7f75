#include "zeroplan/sim/engine.h"

#include <gtest/gtest.h>

#include "zeroplan/sim/graph.h"
#include "zeroplan/sim/trace.h"

namespace zeroplan::sim {
namespace {

struct TwoStreams : ::testing::Test {
  TaskGraph g;
  ResourceId compute = g.add_resource("compute", ResourceKind::compute);
  ResourceId comm = g.add_resource("comm", ResourceKind::comm);
  PoolId dev = g.add_pool("device");
  NameId n = g.intern("t");
  Label L(int unit = -1) { return {n, unit, -1}; }
};

TEST_F(TwoStreams, ChainOnOneResourceSumsDurations) {
  g.add_task(compute, 1.0, L(0));
  g.add_task(compute, 2.0, L(1));
  g.add_task(compute, 0.5, L(2));
  const SimResult r = run(g);
  EXPECT_DOUBLE_EQ(r.makespan_s, 3.5);
  EXPECT_DOUBLE_EQ(r.start_s[2], 3.0);
  EXPECT_DOUBLE_EQ(r.resources[compute].busy_s, 3.5);
}

TEST_F(TwoStreams, FullOverlapHidesTheShorterStream) {
  g.add_task(compute, 3.0, L());
  g.add_task(comm, 2.0, L());
  EXPECT_DOUBLE_EQ(run(g).makespan_s, 3.0);
}

TEST_F(TwoStreams, DependencyAcrossResourcesSerialises) {
  const TaskId a = g.add_task(compute, 1.0, L());
  const TaskId b = g.add_task(comm, 2.0, L(), {a});
  g.add_task(compute, 1.0, L(), {b});
  const SimResult r = run(g);
  EXPECT_DOUBLE_EQ(r.makespan_s, 4.0);
  EXPECT_DOUBLE_EQ(r.start_s[b], 1.0);
}

TEST_F(TwoStreams, FifoOrderHoldsEvenWhenALaterTaskIsReady) {
  // Like a CUDA stream: the second comm task is ready at t=0 but waits behind the first.
  const TaskId a = g.add_task(compute, 2.0, L());
  const TaskId c1 = g.add_task(comm, 1.0, L(), {a});
  const TaskId c2 = g.add_task(comm, 1.0, L());
  const SimResult r = run(g);
  EXPECT_DOUBLE_EQ(r.start_s[c1], 2.0);
  EXPECT_DOUBLE_EQ(r.start_s[c2], 3.0);
  EXPECT_DOUBLE_EQ(r.makespan_s, 4.0);
}

TEST_F(TwoStreams, ZeroDurationTasksRun) {
  const TaskId a = g.add_task(compute, 0.0, L());
  const TaskId b = g.add_task(comm, 0.0, L(), {a});
  g.add_task(compute, 1.0, L(), {b});
  EXPECT_DOUBLE_EQ(run(g).makespan_s, 1.0);
}

TEST_F(TwoStreams, DeadlockNamesTheTaskThatCannotStart) {
  // "wait" heads compute and needs "late", which is queued on comm behind "blocked", which needs "after"
  // queued on compute behind "wait".
  const TaskId wait = g.add_task(compute, 1.0, {g.intern("wait")});
  const TaskId after = g.add_task(compute, 1.0, {g.intern("after")});
  g.add_task(comm, 1.0, {g.intern("blocked")}, {after});
  const TaskId late = g.add_task(comm, 1.0, {g.intern("late")});
  g.add_dep(wait, late);
  try {
    (void)run(g);
    FAIL() << "expected DeadlockError";
  } catch (const DeadlockError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"wait\" on \"compute\" can never start"), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"late\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("behind \"blocked\""), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos);
  }
}

TEST_F(TwoStreams, CycleIsReportedWithATaskOnIt) {
  const TaskId a = g.add_task(compute, 1.0, {g.intern("a")});
  const TaskId b = g.add_task(comm, 1.0, {g.intern("b")}, {a});
  g.add_task(compute, 1.0, {g.intern("c")});
  g.add_dep(a, b);
  try {
    (void)run(g);
    FAIL() << "expected CycleError";
  } catch (const CycleError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cycle"), std::string::npos) << msg;
    EXPECT_TRUE(msg.find("\"a\"") != std::string::npos && msg.find("\"b\"") != std::string::npos) << msg;
  }
}

TEST_F(TwoStreams, MemoryAllocAtStartFreeAtEndOrLater) {
  const NameId act = g.intern("act");
  const NameId w = g.intern("weights");
  g.resident(dev, 100, MemCategory::params, {w});
  const TaskId f = g.add_task(compute, 1.0, L());
  const TaskId x = g.add_task(compute, 1.0, L());
  const TaskId b = g.add_task(compute, 1.0, L());
  g.alloc(f, dev, 50, MemCategory::activations, {act, 0, -1}, b);  // kept until backward ends
  g.alloc(x, dev, 30, MemCategory::buffers, {g.intern("tmp")});      // transient
  const SimResult r = run(g);
  const PoolResult& p = r.pools[dev];
  EXPECT_EQ(p.peak_bytes, 180);
  EXPECT_DOUBLE_EQ(p.peak_time_s, 1.0);
  EXPECT_EQ(p.end_bytes, 100);
  EXPECT_EQ(p.peak_by_category[static_cast<int>(MemCategory::params)], 100);
  EXPECT_EQ(p.peak_by_category[static_cast<int>(MemCategory::activations)], 50);
  EXPECT_EQ(p.peak_by_category[static_cast<int>(MemCategory::buffers)], 30);
  ASSERT_EQ(p.resident_at_peak.size(), 3u);
  EXPECT_EQ(p.resident_at_peak[0].name, "weights");
  EXPECT_EQ(p.resident_at_peak[1].name, "act");
  EXPECT_EQ(p.resident_at_peak[2].name, "tmp");
  // Timeline: 100 at 0, 150 at 0 (collapsed), 180 at 1 after the free of nothing, 150 at 2, 100 at 3.
  ASSERT_FALSE(p.timeline.empty());
  EXPECT_EQ(p.timeline.front(), (std::pair<double, std::int64_t>{0.0, 150}));
  EXPECT_EQ(p.timeline.back(), (std::pair<double, std::int64_t>{3.0, 100}));
}

TEST_F(TwoStreams, FreesBeforeAllocationsAtOneInstant) {
  const NameId m = g.intern("m");
  const TaskId a = g.add_task(compute, 1.0, L());
  const TaskId b = g.add_task(compute, 1.0, L());
  g.alloc(a, dev, 10, MemCategory::buffers, {m});
  g.alloc(b, dev, 10, MemCategory::buffers, {m});
  EXPECT_EQ(run(g).pools[dev].peak_bytes, 10);
}

// A pinned host pool (PyTorch's CachingHostAllocator) takes each allocation as a block of the next power
// of two and keeps freed blocks for the same power of two: 3000 B then, after it is freed, 4000 B share
// one 4096 B block; 5000 B needs an 8192 B block; two 3000 B live at once need two 4096 B blocks.
// reserved = 2 x 4096 + 8192 = 16384, while the requested peak is 6000 B.
TEST_F(TwoStreams, PinnedPoolRoundsToPowersOfTwoAndCachesFreedBlocks) {
  const PoolId host = g.add_pool("host", 0, true);
  const PoolId plain = g.add_pool("plain");
  const NameId m = g.intern("m");
  const TaskId a = g.add_task(compute, 1.0, L());
  const TaskId b = g.add_task(compute, 1.0, L(), {a});
  const TaskId c = g.add_task(compute, 1.0, L(), {b});
  const TaskId d = g.add_task(compute, 1.0, L(), {c});
  for (const PoolId p : {host, plain}) {
    g.alloc(a, p, 3000, MemCategory::buffers, {m});
    g.alloc(b, p, 4000, MemCategory::buffers, {m});
    g.alloc(c, p, 5000, MemCategory::buffers, {m});
    g.alloc(d, p, 3000, MemCategory::buffers, {m});
    g.alloc(d, p, 3000, MemCategory::buffers, {m});
  }
  const SimResult r = run(g);
  EXPECT_EQ(r.pools[host].peak_bytes, 6000);
  EXPECT_EQ(r.pools[host].reserved_bytes, 2 * 4096 + 8192);
  EXPECT_EQ(r.pools[plain].peak_bytes, 6000);
  EXPECT_EQ(r.pools[plain].reserved_bytes, 6000);
}

TEST_F(TwoStreams, FreeBeforeAllocationIsAnError) {
  const TaskId a = g.add_task(compute, 1.0, L());
  const TaskId b = g.add_task(compute, 1.0, L());
  g.alloc(b, dev, 10, MemCategory::buffers, {g.intern("m")}, a);
  EXPECT_THROW((void)run(g), SimError);
}

TEST_F(TwoStreams, ResidentAtPeakGroupsByCategoryAndName) {
  const NameId act = g.intern("act");
  TaskId prev = kNone;
  std::vector<TaskId> fw;
  for (int u = 0; u < 4; ++u) {
    prev = g.add_task(compute, 1.0, L(u), {prev});
    fw.push_back(prev);
  }
  for (int u = 3; u >= 0; --u) {
    prev = g.add_task(compute, 1.0, L(u), {prev});
    g.alloc(fw[static_cast<std::size_t>(u)], dev, 10, MemCategory::activations, {act, u, -1}, prev);
  }
  const PoolResult p = run(g).pools[dev];
  EXPECT_EQ(p.peak_bytes, 40);
  ASSERT_EQ(p.resident_at_peak.size(), 1u);
  EXPECT_EQ(p.resident_at_peak[0].count, 4);
  EXPECT_EQ(p.resident_at_peak[0].bytes, 40);
}

// Contention: two copies on one shared link of capacity 1 each run at half speed.
TEST(SharedGroup, ConcurrentTasksSplitTheCapacity) {
  TaskGraph g;
  const GroupId pcie = g.add_group("pcie", 1.0);
  const ResourceId h2d = g.add_resource("h2d", ResourceKind::copy_h2d, pcie);
  const ResourceId comm = g.add_resource("comm", ResourceKind::comm, pcie);
  const TaskId a = g.add_task(h2d, 2.0, {});
  const TaskId b = g.add_task(comm, 1.0, {});
  const SimResult r = run(g);
  // Both at rate 1/2 until b finishes at t=2 (1 s of work); a has 1 s left, at full rate: ends at 3.
  EXPECT_DOUBLE_EQ(r.end_s[b], 2.0);
  EXPECT_DOUBLE_EQ(r.end_s[a], 3.0);
  EXPECT_DOUBLE_EQ(r.resources[h2d].work_s, 2.0);
  EXPECT_DOUBLE_EQ(r.resources[h2d].busy_s, 3.0);
  EXPECT_DOUBLE_EQ(makespan_lower_bound(g), 3.0);
}

TEST(SharedGroup, CapacityTwoRunsTwoAtFullSpeed) {
  TaskGraph g;
  const GroupId cores = g.add_group("cores", 2.0);
  const ResourceId x = g.add_resource("x", ResourceKind::compute, cores);
  const ResourceId y = g.add_resource("y", ResourceKind::comm, cores);
  const ResourceId z = g.add_resource("z", ResourceKind::copy_d2h, cores);
  g.add_task(x, 1.0, {});
  g.add_task(y, 1.0, {});
  EXPECT_DOUBLE_EQ(run(g).makespan_s, 1.0);
  g.add_task(z, 1.0, {});
  EXPECT_DOUBLE_EQ(run(g).makespan_s, 1.5);  // three at 2/3 speed
}

// Measured core contention: compute at 1/1.25 and a collective at 1/2 of their speed while both run
// (not an equal split of one core): the collective's 0.5 s of work ends at 1.0 s, the compute has done
// 0.8 of its 1.0 s by then and ends 0.2 s later, at 1.2 s (an equal split would end at 1.5 s).
TEST(SharedGroup, ContendedRatesReplaceTheEqualShare) {
  TaskGraph g;
  const GroupId cores = g.add_group("cores", 1.0);
  const ResourceId compute = g.add_resource("compute", ResourceKind::compute, cores, 1.0 / 1.25);
  const ResourceId comm = g.add_resource("comm", ResourceKind::comm, cores, 0.5);
  const TaskId a = g.add_task(compute, 1.0, {});
  const TaskId b = g.add_task(comm, 0.5, {});
  const SimResult r = run(g);
  EXPECT_DOUBLE_EQ(r.end_s[b], 1.0);
  EXPECT_DOUBLE_EQ(r.end_s[a], 1.2);
  // Alone, each runs at full speed.
  TaskGraph alone;
  const GroupId c2 = alone.add_group("cores", 1.0);
  const ResourceId x = alone.add_resource("compute", ResourceKind::compute, c2, 0.8);
  alone.add_task(x, 1.0, {});
  EXPECT_DOUBLE_EQ(run(alone).makespan_s, 1.0);
  // The group's capacity is no bound when its members run faster together than an equal split.
  EXPECT_LE(makespan_lower_bound(g), r.makespan_s);
  EXPECT_DOUBLE_EQ(makespan_lower_bound(g), 1.0);
}

TEST(RankSkew, ACollectiveStartsWhenTheLastRankArrivesAndWaitingForItRealignsTheRanks) {
  TaskGraph g;
  const ResourceId compute = g.add_resource("compute", ResourceKind::compute);
  const ResourceId comm = g.add_resource("comm", ResourceKind::comm);
  g.set_skew(comm, compute, 0.1);
  const TaskId a = g.add_task(compute, 10.0, {});
  const TaskId x = g.add_task(comm, 1.0, {}, {a});  // the last rank 0.1 x 10 s behind: work 11-12
  const TaskId b = g.add_task(compute, 5.0, {}, {x});  // this rank waited for x, as every rank: aligned
  const TaskId y = g.add_task(comm, 1.0, {}, {b});     // 0.1 x 5 s behind: work 17.5-18.5
  const TaskId c = g.add_task(compute, 4.0, {}, {y});  // 18.5-22.5
  const TaskId z = g.add_task(comm, 1.0, {});          // issued as c starts: nothing computed since aligned
  const TaskId w = g.add_task(comm, 1.0, {}, {c});     // z ended while c ran (no realignment): 0.1 x 4 s
  const SimResult r = run(g);
  EXPECT_DOUBLE_EQ(r.start_s[x], 10.0);
  EXPECT_DOUBLE_EQ(r.end_s[x], 12.0);
  EXPECT_DOUBLE_EQ(r.start_s[b], 12.0);
  EXPECT_DOUBLE_EQ(r.end_s[y], 18.5);
  EXPECT_DOUBLE_EQ(r.end_s[z], 19.5);
  EXPECT_DOUBLE_EQ(r.end_s[w], 23.9);
  // The wait holds the collective's stream: its busy time counts it, as a measured comm span does.
  EXPECT_DOUBLE_EQ(r.resources[comm].busy_s, 2.0 + 1.5 + 1.0 + 1.4);
  EXPECT_DOUBLE_EQ(r.resources[comm].work_s, 4.0);
}

TEST(RankSkew, AWaitingCollectiveTakesNoShareOfTheCores) {
  // Compute 2 s, then a collective after it beside 2 s more compute, on shared cores: returns the ends of
  // (collective, second compute).
  auto ends = [](double skew) {
    TaskGraph g;
    const GroupId cores = g.add_group("cores", 1.0);
    const ResourceId compute = g.add_resource("compute", ResourceKind::compute, cores, 0.5);
    const ResourceId comm = g.add_resource("comm", ResourceKind::comm, cores, 0.5);
    if (skew > 0) g.set_skew(comm, compute, skew);
    const TaskId a = g.add_task(compute, 2.0, {});
    const TaskId x = g.add_task(comm, 1.0, {}, {a});
    const TaskId b = g.add_task(compute, 2.0, {});
    const SimResult r = run(g);
    return std::pair{r.end_s[x], r.end_s[b]};
  };
  // The collective waits 2 s for the last rank (2-4) while the compute runs at full speed, then works alone.
  EXPECT_EQ(ends(1.0), (std::pair{5.0, 4.0}));
  // Without skew the two share the cores from 2 on: each at half speed.
  EXPECT_EQ(ends(0.0), (std::pair{4.0, 5.0}));
}

TEST(SharedGroup, EachOtherMemberAddsItsMeasuredSlowdown) {
  TaskGraph g;
  const GroupId cores = g.add_group("cores", 1.0);
  const ResourceId compute = g.add_resource("compute", ResourceKind::compute, cores, 0.5);  // x2 beside one
  const ResourceId comm = g.add_resource("comm", ResourceKind::comm, cores, 0.8);
  const ResourceId comm_rs = g.add_resource("comm.rs", ResourceKind::comm, cores, 0.8);
  const TaskId a = g.add_task(compute, 3.0, {});
  const TaskId b = g.add_task(comm, 1.0, {});
  const TaskId c = g.add_task(comm_rs, 1.0, {});
  const SimResult r = run(g);
  // All three run: compute at 1 / (1 + 2 x 1) = 1/3, each collective at 1 / (1 + 2 x 0.25) = 2/3, so
  // both collectives end at 1.5 (compute has done 0.5); then compute alone: 2.5 more.
  EXPECT_DOUBLE_EQ(r.end_s[b], 1.5);
  EXPECT_DOUBLE_EQ(r.end_s[c], 1.5);
  EXPECT_DOUBLE_EQ(r.end_s[a], 4.0);
}

TEST(Graph, CriticalPathFollowsTheLongestChain) {
  TaskGraph g;
  const ResourceId r0 = g.add_resource("a", ResourceKind::compute);
  const ResourceId r1 = g.add_resource("b", ResourceKind::comm);
  const TaskId a = g.add_task(r0, 1.0, {});
  const TaskId b = g.add_task(r1, 5.0, {}, {a});
  const TaskId c = g.add_task(r0, 2.0, {}, {a});
  const TaskId d = g.add_task(r0, 1.0, {}, {b, c});
  const CriticalPath cp = critical_path(g);
  EXPECT_DOUBLE_EQ(cp.length_s, 7.0);
  EXPECT_EQ(cp.tasks, (std::vector<TaskId>{a, b, d}));
  EXPECT_DOUBLE_EQ(makespan_lower_bound(g), 7.0);
  EXPECT_GE(run(g).makespan_s, makespan_lower_bound(g));
}

// The makespan bound's longest chain: one pass in id order when every dependency is an earlier task (the
// lowering's graphs), the depth-first critical path otherwise; the same length either way, on random graphs
// (a dependency added later, on a later task, sends the graph down the depth-first path).
TEST(Graph, LongestChainInIdOrderEqualsTheCriticalPath) {
  std::uint64_t seed = 12345;
  auto next = [&seed](std::uint64_t n) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return (seed >> 33) % n;
  };
  for (int trial = 0; trial < 20; ++trial) {
    TaskGraph g;
    const ResourceId r0 = g.add_resource("a", ResourceKind::compute);
    const ResourceId r1 = g.add_resource("b", ResourceKind::comm);
    std::vector<TaskId> ids;
    for (int t = 0; t < 200; ++t) {
      const TaskId id = g.add_task(t % 3 == 0 ? r1 : r0, 0.25 * static_cast<double>(1 + next(8)), {});
      for (int k = 0; k < 3 && !ids.empty(); ++k) g.add_dep(id, ids[next(ids.size())]);
      ids.push_back(id);
    }
    EXPECT_EQ(longest_chain_s(g), critical_path(g).length_s);
    // The engine finds the same chain beside its run, and the bound from the run is the graph's.
    const SimResult in_order = run(g);
    EXPECT_EQ(in_order.longest_chain_s, longest_chain_s(g));
    EXPECT_EQ(makespan_lower_bound(g, in_order), makespan_lower_bound(g));
    // An earlier task waits for a later one (on a resource of its own, so the run can end): acyclic,
    // depth-first now.
    const TaskId late = g.add_task(g.add_resource("late", ResourceKind::copy_h2d), 9.0, {});
    g.add_dep(ids[5], late);
    EXPECT_NO_THROW(check_acyclic(g));
    EXPECT_EQ(longest_chain_s(g), critical_path(g).length_s);
    const SimResult out_of_order = run(g);  // no chain beside the run: the bound finds it
    EXPECT_EQ(out_of_order.longest_chain_s, -1);
    EXPECT_EQ(makespan_lower_bound(g, out_of_order), makespan_lower_bound(g));
  }
  TaskGraph cyclic;  // a cycle through a later task is still found
  const ResourceId r = cyclic.add_resource("a", ResourceKind::compute);
  const TaskId a = cyclic.add_task(r, 1.0, {});
  const TaskId b = cyclic.add_task(r, 1.0, {}, {a});
  cyclic.add_dep(a, b);
  EXPECT_THROW(check_acyclic(cyclic), CycleError);
}

TEST(Trace, ByteIdenticalAndWellFormed) {
  auto build = [] {
    TaskGraph g;
    const ResourceId r0 = g.add_resource("compute", ResourceKind::compute);
    const ResourceId r1 = g.add_resource("comm \"nccl\"", ResourceKind::comm);
    const PoolId p = g.add_pool("device");
    const NameId cat = g.intern("fwd");
    const TaskId a = g.add_task(r0, 1e-3, {cat, 0, 1}, {}, cat);
    const TaskId b = g.add_task(r1, 2.5e-3, {g.intern("ag")}, {a});
    g.alloc(a, p, 1000, MemCategory::activations, {cat}, b);
    return g;
  };
  const TaskGraph g1 = build();
  const TaskGraph g2 = build();
  const std::string t1 = chrome_trace_json(g1, run(g1));
  const std::string t2 = chrome_trace_json(g2, run(g2));
  EXPECT_EQ(t1, t2);
  EXPECT_NE(t1.find("\"ph\":\"X\",\"ts\":0.000,\"dur\":1000.000"), std::string::npos) << t1;
  EXPECT_NE(t1.find("\"ph\":\"C\""), std::string::npos);
  EXPECT_NE(t1.find("comm \\\"nccl\\\""), std::string::npos);
  EXPECT_NE(t1.find("\"name\":\"fwd u0 mb1\""), std::string::npos);
}

}  // namespace
}  // namespace zeroplan::sim
