// What a C++ process must do before CUDA work, which Python's torch.cuda.init() does for a Python one.
#pragma once

#include <zeroplan/config.h>

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
#endif

}  // namespace zeroplan
