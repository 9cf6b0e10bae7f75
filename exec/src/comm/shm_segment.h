// The shared segment of ShmCommunicator (shm_communicator.cpp): per rank a header of two counters on
// cache lines of their own and a staging area; made by rank 0, opened and mapped by every rank.
#pragma once

#include <zeroplan/exec/communicator.h>

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zeroplan::exec::shm {

constexpr std::size_t kLine = 64;
constexpr std::size_t kNameBytes = 32;

struct alignas(kLine) Counter {
  std::atomic<std::uint64_t> value;
};
struct SlotHeader {
  Counter published;
  Counter consumed;
};
static_assert(sizeof(SlotHeader) == 2 * kLine);

// Per rank a header and a staging area of `chunk` bytes.
struct Layout {
  std::size_t chunk = 0, stride = 0, bytes = 0;
  Layout(std::int64_t chunk_bytes, int world)
      : chunk(static_cast<std::size_t>(chunk_bytes) / kLine * kLine),
        stride(sizeof(SlotHeader) + chunk),
        bytes(stride * static_cast<std::size_t>(world)) {}
};

// Collective over `base`: rank 0 makes the segment under a random name and reserves its pages (so a full
// /dev/shm is an error here, not a SIGBUS later), the others open it, every rank maps it, and the name is
// removed once all have, so nothing is left behind whatever happens next. nullptr on every rank when any
// rank could not (`why` says what, on the rank that could not). Also gathers each rank's process id.
char* open_segment(Communicator& base, std::size_t bytes, std::vector<pid_t>& pids, std::string& why);

}  // namespace zeroplan::exec::shm
