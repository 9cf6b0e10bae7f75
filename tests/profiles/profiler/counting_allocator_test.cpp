#include "zeroplan/profiles/counting_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>

namespace zeroplan {
namespace {

TEST(CountingAllocator, CountsExactTensorBytesAndPeak) {
  ScopedCpuAllocator scoped;
  CountingAllocator& a = scoped.allocator();
  EXPECT_EQ(c10::GetCPUAllocator(), &a);
  const std::int64_t base = a.reset_peak();
  {
    torch::Tensor t = torch::empty({1000, 3}, torch::kFloat32);
    EXPECT_EQ(a.live_bytes() - base, 1000 * 3 * 4);
    torch::Tensor u = torch::empty({7}, torch::kInt64);
    EXPECT_EQ(a.live_bytes() - base, 12000 + 56);
  }
  EXPECT_EQ(a.live_bytes(), base);
  EXPECT_EQ(a.peak_bytes() - base, 12056);
  EXPECT_EQ(a.reset_peak(), base);
  EXPECT_EQ(a.peak_bytes(), base);
}

TEST(CountingAllocator, UninstallRestoresPreviousAndLateFreesAreSafe) {
  at::Allocator* before = c10::GetCPUAllocator();
  torch::Tensor survivor;
  {
    ScopedCpuAllocator scoped;
    survivor = torch::ones({256});
    EXPECT_EQ(scoped.allocator().live_bytes(), 1024);
  }
  EXPECT_EQ(c10::GetCPUAllocator(), before);
  survivor.resize_({4096});  // the retired allocator still serves its storages
  survivor.fill_(2);
  EXPECT_EQ(survivor.sum().item<float>(), 8192.0f);
  survivor = torch::Tensor();
}

TEST(CountingAllocator, Nests) {
  ScopedCpuAllocator outer;
  {
    ScopedCpuAllocator inner;
    torch::Tensor t = torch::empty({100}, torch::kFloat32);
    EXPECT_EQ(inner.allocator().live_bytes(), 400);
    EXPECT_EQ(outer.allocator().live_bytes(), 400);
  }
  EXPECT_EQ(outer.allocator().live_bytes(), 0);
}

// Two zeroplan.wrap engines: the first collected after the second was made. The first scope ends while
// the second is installed (no abort); when the second ends, the allocator from before both is back.
TEST(CountingAllocator, ScopesEndingOutOfOrderLeaveNoEndedOneInstalled) {
  at::Allocator* before = c10::GetCPUAllocator();
  auto first = std::make_unique<ScopedCpuAllocator>();
  auto second = std::make_unique<ScopedCpuAllocator>();
  at::Allocator* second_alloc = &second->allocator();
  first.reset();
  EXPECT_EQ(c10::GetCPUAllocator(), second_alloc);
  torch::Tensor t = torch::empty({100}, torch::kFloat32);
  EXPECT_EQ(second->allocator().live_bytes(), 400);
  t = torch::Tensor();
  second.reset();
  EXPECT_EQ(c10::GetCPUAllocator(), before);
}

TEST(CountingAllocator, LimitThrowsTypedErrorWithNumbers) {
  ScopedCpuAllocator scoped(/*limit_bytes=*/4000);
  torch::Tensor small = torch::empty({500}, torch::kFloat32);  // 2000 bytes
  try {
    torch::Tensor big = torch::empty({1000}, torch::kFloat32);  // would need 6000
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.need_bytes(), 6000);
    EXPECT_EQ(e.limit_bytes(), 4000);
    EXPECT_EQ(e.request_bytes(), 4000);
    EXPECT_EQ(std::string(e.what()),
              "out of device memory on cpu: need 6000 bytes, limit 4000 (allocating 4000 bytes with "
              "2000 live)");
  }
  EXPECT_EQ(scoped.allocator().live_bytes(), 2000);  // the refused request is not counted
  scoped.allocator().set_limit(-1);
  torch::Tensor big = torch::empty({1000}, torch::kFloat32);
  EXPECT_EQ(scoped.allocator().live_bytes(), 6000);
}

TEST(CountingAllocator, LimitErrorSurvivesAnOpAndBackward) {
  torch::Tensor w = torch::randn({64, 64}, torch::requires_grad());
  torch::Tensor x = torch::randn({32, 64});
  ScopedCpuAllocator scoped;
  scoped.allocator().set_limit(scoped.allocator().live_bytes() + 100);
  EXPECT_THROW(torch::matmul(x, w), OutOfMemoryError);
  scoped.allocator().set_limit(-1);
  torch::Tensor y = torch::matmul(x, w).sum();
  scoped.allocator().set_limit(scoped.allocator().live_bytes() + 8);
  EXPECT_THROW(y.backward(), OutOfMemoryError);
}

// c10's contract: raw_allocate asserts the context is the data pointer, and raw_deleter() frees it.
TEST(CountingAllocator, RawAllocateHonoursC10Contract) {
  ScopedCpuAllocator scoped;
  CountingAllocator& a = scoped.allocator();
  const std::int64_t base = a.live_bytes();
  void* p = a.raw_allocate(4096);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(a.live_bytes() - base, 4096);
  at::DataPtr d = a.allocate(100);
  EXPECT_EQ(d.get(), d.get_context());
  EXPECT_EQ(d.get_deleter(), a.raw_deleter());
  EXPECT_EQ(a.live_bytes() - base, 4196);
  a.raw_deallocate(p);
  d.clear();
  EXPECT_EQ(a.live_bytes(), base);
}

// Convolution (oneDNN workspaces go through raw_allocate), BatchNorm and pooling, forward and backward:
// they run under the allocator, and once everything is released the live bytes are back to the base.
TEST(CountingAllocator, ConvBatchNormPoolForwardBackward) {
  torch::manual_seed(0);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).padding(1).bias(false));
  torch::nn::BatchNorm2d bn(8);
  ScopedCpuAllocator scoped;
  CountingAllocator& a = scoped.allocator();
  const std::int64_t base = a.reset_peak();
  {
    torch::Tensor x = torch::randn({4, 3, 16, 16});
    const std::int64_t input_bytes = 4 * 3 * 16 * 16 * 4;
    EXPECT_EQ(a.live_bytes() - base, input_bytes);
    torch::Tensor y = torch::max_pool2d(torch::relu(bn(conv(x))), 2);
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{4, 8, 8, 8}));
    y.sum().backward();
    EXPECT_TRUE(conv->weight.grad().defined());
    EXPECT_GE(a.peak_bytes() - base, input_bytes + 4 * 8 * 16 * 16 * 4);  // at least the conv output
  }
  conv->weight.mutable_grad() = torch::Tensor();
  bn->weight.mutable_grad() = torch::Tensor();
  bn->bias.mutable_grad() = torch::Tensor();
  EXPECT_EQ(a.live_bytes(), base);
}

// bf16 and fp16 GEMMs (oneDNN / reduced-precision paths allocate through raw_allocate too).
TEST(CountingAllocator, ReducedPrecisionMatmuls) {
  ScopedCpuAllocator scoped;
  CountingAllocator& a = scoped.allocator();
  for (auto dtype : {torch::kBFloat16, torch::kFloat16}) {
    const std::int64_t base = a.live_bytes();
    {
      torch::Tensor x = torch::randn({64, 128}).to(dtype);
      torch::Tensor w = torch::randn({128, 32}).to(dtype).requires_grad_();
      torch::Tensor y = torch::matmul(x, w);
      EXPECT_EQ(y.scalar_type(), dtype);
      EXPECT_EQ(a.live_bytes() - base, (64 * 128 + 128 * 32 + 64 * 32) * 2);
      y.sum().backward();
      EXPECT_EQ(w.grad().scalar_type(), dtype);
      torch::Tensor ref = torch::matmul(x.to(torch::kFloat32), w.detach().to(torch::kFloat32));
      EXPECT_TRUE(torch::allclose(y.to(torch::kFloat32), ref, 5e-2, 5e-1)) << dtype;
    }
    EXPECT_EQ(a.live_bytes(), base) << dtype;
  }
}

}  // namespace
}  // namespace zeroplan
