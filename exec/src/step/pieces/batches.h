// The executor's pieces (pieces.h lists them): Batches, the data loader: this rank's microbatches of each
// step from the model's task, the next one made on a worker thread while the step computes (batches.cpp).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <future>
#include <optional>
#include <utility>

#include "zeroplan/profiles/zoo.h"

namespace zeroplan::exec::pieces {

// A DataLoader with one worker and a prefetch of one microbatch: get(step, k) returns samples
// [(rank * microbatches + k) * micro_batch, + micro_batch) of `step` and starts the microbatch after it
// ((step, k + 1), or (step + 1, 0) after the last) in the background, in pinned host memory on a CUDA
// device (the copy to the device then needs no staging). In the background only where the task allows it
// (zoo::Task::batches_in_background) and `background` is asked for: the executor asks on CUDA, where the
// host is otherwise idle while the device computes; on a CPU device the worker would take cores from the
// step. A request out of that order (a pipeline's schedule, a resumed step) is made on the spot, the
// prefetched one dropped. The batches are the same bits either way. Where the task draws its samples on
// `device` itself (zoo::Task::draws_on: the image task on CUDA), they are made there in line: a batch made
// ahead would sit in device memory beside the step's.
class Batches {
 public:
  Batches(const zoo::Task& task, int rank, int microbatches, std::int64_t micro_batch, bool background, bool pin,
          const torch::Device& device = torch::kCPU);
  ~Batches();  // waits for a batch in flight
  Batches(const Batches&) = delete;
  Batches& operator=(const Batches&) = delete;

  zoo::Batch get(std::int64_t step, int k);
  bool background() const { return background_; }
  // How many get() calls were answered by the batch made in the background (for tests).
  std::int64_t prefetched() const { return prefetched_; }

 private:
  zoo::Batch make(std::int64_t step, int k) const;

  const zoo::Task& task_;
  int rank_;
  int microbatches_;
  std::int64_t micro_batch_;
  torch::Device device_;
  bool on_device_;
  bool background_;
  bool pin_;
  std::optional<std::pair<std::int64_t, int>> next_key_;
  std::future<zoo::Batch> next_;
  std::int64_t prefetched_ = 0;
};

}  // namespace zeroplan::exec::pieces
