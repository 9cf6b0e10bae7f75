// The host allocator behind offloaded state, one rule for the simulator and the executor.
// GPU clusters pin host memory through PyTorch's CachingHostAllocator (ATen/core/CachingHostAllocator.h,
// allocate(): "Round up the allocation to the nearest power of two to improve reuse. These power of two
// sizes are also used to index into the free list", c10::llvm::PowerOf2Ceil, free list per Log2_64_Ceil;
// torch 2.15 headers), which is what tensor.pin_memory() uses: DeepSpeed's pinned offload buffers
// (accelerator/cuda_accelerator.py pin_memory) and FSDP's pinned shards and CPU gradients both land
// there. A freed block stays cached for the next request of the same power of two and is never given
// back during training, so what the allocator holds is, per power of two, the most blocks ever live at
// once times that size. CPU clusters: plain memory of the requested size.
#pragma once

#include <cstdint>

namespace zeroplan {

// The power of two a pinned request of `bytes` (> 0) is served from: ceil(log2(bytes)).
constexpr int pinned_block_class(std::int64_t bytes) {
  int k = 0;
  while ((std::int64_t{1} << k) < bytes) ++k;
  return k;
}

// The bytes a pinned request of `bytes` really takes: the next power of two (0 for 0).
constexpr std::int64_t pinned_block_bytes(std::int64_t bytes) {
  return bytes <= 0 ? 0 : std::int64_t{1} << pinned_block_class(bytes);
}

static_assert(pinned_block_bytes(1) == 1 && pinned_block_bytes(4096) == 4096 && pinned_block_bytes(4097) == 8192);

}  // namespace zeroplan
