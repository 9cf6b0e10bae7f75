// Collectives between the ranks of one host through shared memory, for CPU tensors: what Gloo sends over
// loopback TCP (every byte copied through the kernel twice; on the 2-core development machine a third of
// a 2-rank step's CPU time was the kernel's) is written once into a shared segment and read by the peers.
// DeepSpeed's CPU accelerator does the same for its all-reduce (its shm op).
//
// all_reduce, all_gather, reduce_scatter and broadcast of contiguous CPU tensors run here, on a worker
// thread of the communicator's own, in issue order; everything else (barrier, send/recv, other tensors)
// goes to the Gloo communicator underneath, after the shared-memory work issued before it; split and
// duplicate make shared-memory communicators over Gloo's. Sums
// add every rank's values in rank order, so every rank gets the same bits. A peer that stops arriving
// makes the waiting rank throw CommError: at once when `diagnose` names a dead peer, else after the
// timeout. Its backend() is "shm"; its reduce-scatter holds no temporary (Gloo's ring holds a chunk).
#pragma once

#include <zeroplan/exec/communicator.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace zeroplan::exec {

struct ShmOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Bytes each rank stages per round (a collective of more moves in rounds): the segment is world x this.
  std::int64_t chunk_bytes = 16ll << 20;
  // Names the peer a failure is due to ("rank 1 exited with signal 9"), "" when it cannot tell.
  std::function<std::string()> diagnose;
};

// The transport of CPU ranks: "shm" when every rank runs on this host, else "gloo"; the environment
// variable ZEROPLAN_CPU_TRANSPORT (auto, gloo, shm) may ask for Gloo alone. Throws CommError on another
// value, or on shm for ranks of several hosts. What `zeroplan probe` measures and runs use, named so in
// the cluster's collective fits and the run record's backend.
std::string cpu_backend(bool one_host);

// Collective over `base`'s ranks, which must all run on this host (the segment is made by rank 0 and
// named to the others through `base`). Where it cannot be made, reserved or mapped on some rank (a small
// /dev/shm), every rank gets `base` back and rank 0 says why in one line on stderr.
std::unique_ptr<Communicator> make_shm_communicator(std::unique_ptr<Communicator> base, const ShmOptions& options = {});

}  // namespace zeroplan::exec
