// What a C++ process must do before CUDA work, which Python's torch.cuda.init() does for a Python one.
#pragma once

#include <zeroplan/config.h>

#include <cstdint>

namespace zeroplan {

#if ZEROPLAN_HAVE_CUDA
// Initialises CUDA in torch's context (before it, the context reports no pointer pinned: is_pinned() is
// false for the caching host allocator's blocks, seen on the lent H100), starts the autograd engines'
// per-device threads, and checks once per process that a backward of a CUDA tensor runs. On the lent
// H100 with torch 2.11 every backward of a C++ process failed on the engine's
// "device.index() < device_ready_queues_.size()" assert; should that check fail, one note on stderr
// names what the engine holds. The calling thread's backward then runs on that thread (autograd's
// multithreading off, as torch.autograd.set_multithreading_enabled(False) does; one device per process,
// so nothing is lost, and the device's stream semantics are unchanged). Call it on every thread that
// will run a backward on CUDA.
void cuda_init();

// Bytes the GEMM libraries keep allocated through torch's caching allocator once a matrix product ran on
// the current stream: cuBLAS's and cuBLASLt's workspaces (32 MiB and 1 MiB on an H200 with torch 2.11),
// held per (handle, stream) until exit, so every CUDA run's measured peak holds them. Measured once per
// process, at the first cuda_init(), before any product: the allocated bytes around an mm and an addmm in
// fp32, bf16 and fp16 on the current stream (the stream zeroplan computes on). 0 where something had run a
// product on that stream before (the workspaces were already there).
std::int64_t cuda_library_workspace_bytes();
#endif

}  // namespace zeroplan
