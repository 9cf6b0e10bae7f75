#include "zeroplan/tuner/max_model.h"

#include <gtest/gtest.h>

#include "fixtures.h"
#include "zeroplan/tuner/search.h"

namespace zeroplan::tuner {
namespace {

using testing::a100;

TEST(MaxModel, BinarySearchFindsTheLargestThatFitsAndItsPlan) {
  MaxModelOptions o;
  o.seq = 128;
  o.vocab = 1000;
  o.family = {{"h128", 4, 128, 4}, {"h256", 4, 256, 4}, {"h512", 4, 512, 8}, {"h1024", 4, 1024, 8},
              {"h2048", 4, 2048, 16}, {"h4096", 4, 4096, 32}, {"h8192", 4, 8192, 64}};
  o.tune.set_threads(2);
  const ClusterProfile cl = a100(1);
  TuneConstraints c;
  c.set_global_batch(8).set_knobs({"zero_stage", "offload_optimizer", "offload_grads", "checkpointing"});
  c.fix("precision", "bf16").set_device_headroom_bytes(cl.device.mem_bytes - (2LL << 30));  // 2 GiB per rank
  const MaxModelResult r = max_model(cl, c, o);
  ASSERT_GE(r.largest, 0);
  ASSERT_LT(r.largest, static_cast<int>(o.family.size()) - 1) << "the family should not all fit in 2 GiB";
  EXPECT_LE(r.tried.size(), 3u);  // ceil(log2(8))
  for (const MaxModelTry& t : r.tried) {
    const auto idx = std::find_if(o.family.begin(), o.family.end(), [&](const GptShape& g) { return g.name == t.shape.name; }) -
                     o.family.begin();
    EXPECT_EQ(t.fits, idx <= r.largest) << t.shape.name;
    if (!t.fits) {
      EXPECT_FALSE(t.why_not.empty());
    }
  }
  // The next larger model really does not fit.
  ASSERT_TRUE(r.largest_tune.has_value());
  ASSERT_NE(r.largest_tune->best(), nullptr);
  EXPECT_EQ(r.largest_tune->model.name, o.family[static_cast<std::size_t>(r.largest)].name);
  const std::string md = max_model_markdown(r, o);
  EXPECT_NE(md.find("**" + o.family[static_cast<std::size_t>(r.largest)].name + "**"), std::string::npos) << md;
}

// Offloaded state on a GPU cluster is pinned in power-of-two blocks (zeroplan/profiles/host_allocator.h),
// so a host that holds h1024's requested bytes but not its pinned blocks trains only h512: the largest
// model is smaller than by counting requested bytes; with room for the blocks h1024 trains again.
TEST(MaxModel, PinnedHostBlocksMakeTheLargestModelSmaller) {
  MaxModelOptions o;
  o.seq = 128;
  o.vocab = 1000;
  o.tune.set_threads(2);
  ClusterProfile cl = a100(1);
  TuneConstraints c;
  c.set_global_batch(8).set_knobs({"zero_stage"});
  c.fix("precision", "bf16").fix("zero_stage", "2").fix("offload_optimizer", "true").fix("offload_grads", "true");
  MaxModelOptions one = o;
  one.family = {{"h1024", 4, 1024, 8}};
  const MaxModelResult alone = max_model(cl, c, one);
  ASSERT_TRUE(alone.tried.at(0).fits);
  const PoolPeak host = alone.tried[0].best->prediction.host;
  ASSERT_GT(host.allocator_overhead_bytes, 0) << "pinned blocks round up";
  o.family = {{"h512", 4, 512, 8}, {"h1024", 4, 1024, 8}, {"h2048", 4, 2048, 16}};
  // The node's host memory is shared by its 8 ranks.
  cl.host.mem_bytes = 8 * (host.peak_bytes + host.allocator_overhead_bytes / 2);  // the bytes fit, the blocks do not
  EXPECT_EQ(max_model(cl, c, o).largest, 0);
  cl.host.mem_bytes = 8 * host.total_bytes();
  EXPECT_EQ(max_model(cl, c, o).largest, 1);
}

// A node's host memory is shared by the ranks it runs: 8 ranks of a100(1) get an eighth of it each (what
// the headroom leaves), 2 ranks on the same node half, 16 ranks on two nodes an eighth.
TEST(MaxModel, HostMemoryIsSharedByTheRanksOfANode) {
  ClusterProfile cl = a100(2);
  TuneConstraints c;
  c.set_global_batch(8);
  c.host_headroom_bytes = 400'000'000'000LL;
  const std::int64_t left = cl.host.mem_bytes - c.host_headroom_bytes;
  EXPECT_EQ(memory_limits(cl, c, 8).host_bytes, left / 8);
  EXPECT_EQ(memory_limits(cl, c, 2).host_bytes, left / 2);
  EXPECT_EQ(memory_limits(cl, c, 16).host_bytes, left / 8);
  EXPECT_EQ(memory_limits(cl, c, 16).device_bytes, cl.device.mem_bytes);
}

TEST(MaxModel, FamilyIsOrderedBySize) {
  std::int64_t last = 0;
  for (const GptShape& g : gpt_family()) {
    const std::int64_t p = g.layers * (12 * g.hidden * g.hidden);
    EXPECT_GT(p, last) << g.name;
    EXPECT_EQ(g.hidden % g.heads, 0) << g.name;
    last = p;
  }
}

}  // namespace
}  // namespace zeroplan::tuner
