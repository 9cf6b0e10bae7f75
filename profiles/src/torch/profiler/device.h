// Private: what the profiler needs from a device, with a CPU and a CUDA implementation.
#pragma once

#include <zeroplan/config.h>

#include <cstdint>
#include <memory>
#include <string>

#include "zeroplan/profiles/cuda_init.h"
#include "zeroplan/profiles/timer.h"

namespace zeroplan::detail {

// Device memory in use, for phases: begin_phase() makes the peak the current live bytes and returns
// them; peak() is the highest live value since.
class MemoryMeter {
 public:
  virtual ~MemoryMeter() = default;
  virtual std::int64_t begin_phase() = 0;
  virtual std::int64_t live() const = 0;
  virtual std::int64_t peak() const = 0;
  // Bytes the device's libraries hold for the whole process once they ran (cuda_init.h: the GEMM
  // workspaces); 0 on a CPU.
  virtual std::int64_t library_bytes() const { return 0; }
};

#if ZEROPLAN_HAVE_CUDA
// The caching allocator's allocated_bytes (aggregate pool) of one device.
std::unique_ptr<MemoryMeter> make_cuda_memory_meter(int device_index);
// CUDA events recorded on the current stream; stop_s() waits for the stop event.
std::unique_ptr<PhaseTimer> make_cuda_event_timer();
std::string cuda_device_name(int device_index);
void cuda_synchronize();
#endif

#if ZEROPLAN_HAVE_CUPTI
// Sum of the durations of the kernels that ran between start() and stop_s() (CUPTI concurrent-kernel
// activity records, flushed at stop). One at a time per process.
std::unique_ptr<PhaseTimer> make_cupti_kernel_timer();
#endif

}  // namespace zeroplan::detail
