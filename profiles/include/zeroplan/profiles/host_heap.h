// The host heap as a training process wants it: memory freed by one step kept for the next.
#pragma once

namespace zeroplan {

// glibc returns every large block (above its mmap threshold, 128 KiB to 32 MiB) to the kernel when it is
// freed and maps it again, zero-filled page by page, when the next step asks: a step's large temporaries
// (logits, their loss, activations) pay page faults every time (measured: a small GPT's loss at micro
// batch 2 took 8.8-10.2 ms per call so and 6.4-7.0 ms with the blocks kept; the step 5% faster). This
// keeps them in the heap (no mmap'd blocks, no trimming), as jemalloc or tcmalloc would, which PyTorch's
// CPU performance guide recommends. Called by every rank of `zeroplan run` and by the profiler, so both
// time units under the same allocator. No effect outside glibc. Peaks are the counting allocator's
// (requested bytes), not the heap's size, so nothing measured changes but time.
void retain_freed_host_memory();

}  // namespace zeroplan
