// Batches: the executor's data loader (pieces/batches.h).
#include "pieces/batches.h"

namespace zeroplan::exec::pieces {

Batches::Batches(const zoo::Task& task, int rank, int microbatches, std::int64_t micro_batch, bool background,
                 bool pin, const torch::Device& device)
    : task_(task),
      rank_(rank),
      microbatches_(microbatches),
      micro_batch_(micro_batch),
      device_(device),
      on_device_(task.draws_on(device)),
      background_(background && !on_device_ && task.batches_in_background()),
      pin_(pin && !on_device_) {}

Batches::~Batches() {
  if (next_.valid()) next_.wait();  // its exception, if any, goes with it
}

zoo::Batch Batches::make(std::int64_t step, int k) const {
  const std::int64_t first = (static_cast<std::int64_t>(rank_) * microbatches_ + k) * micro_batch_;
  if (on_device_) return task_.batch_on(device_, step, first, micro_batch_);
  zoo::Batch batch = task_.batch(step, first, micro_batch_);
  if (pin_) {
    batch.input = batch.input.pin_memory();
    batch.target = batch.target.pin_memory();
  }
  return batch;
}

zoo::Batch Batches::get(std::int64_t step, int k) {
  zoo::Batch batch;
  if (next_.valid() && next_key_ == std::make_pair(step, k)) {
    batch = next_.get();  // rethrows what the worker threw
    ++prefetched_;
  } else {
    if (next_.valid()) next_.wait();  // out of order: the prefetched batch is dropped
    next_ = {};
    batch = make(step, k);
  }
  if (background_) {
    const std::pair<std::int64_t, int> key = k + 1 < microbatches_ ? std::make_pair(step, k + 1) : std::make_pair(step + 1, 0);
    next_key_ = key;
    next_ = std::async(std::launch::async, [this, key] { return make(key.first, key.second); });
  }
  return batch;
}

}  // namespace zeroplan::exec::pieces
