#include "zeroplan/profiles/counting_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

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

}  // namespace
}  // namespace zeroplan
