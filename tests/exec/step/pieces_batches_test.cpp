// Batches, the executor's data loader, on its own (exec/src/step/pieces/batches.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../../../exec/src/step/pieces/batches.h"
#include "zeroplan/profiles/zoo.h"

namespace zeroplan::exec::pieces {
namespace {

// What the executor asked the task for before the loader: rank r's microbatch k of a step.
zoo::Batch direct(const zoo::Task& task, std::int64_t step, int rank, int m, std::int64_t mb, int k) {
  return task.batch(step, (static_cast<std::int64_t>(rank) * m + k) * mb, mb);
}

TEST(Batches, TheWorkerMakesTheNextMicrobatchWithTheSameBitsAsInLine) {
  zoo::Model model = zoo::build_model("resnet", "resnet-tiny", {}, 0);
  ASSERT_TRUE(model.task->batches_in_background());
  Batches loader(*model.task, /*rank=*/1, /*microbatches=*/3, /*micro_batch=*/2, /*background=*/true, /*pin=*/false);
  ASSERT_TRUE(loader.background());
  for (std::int64_t step = 0; step < 3; ++step) {
    for (int k = 0; k < 3; ++k) {
      zoo::Batch got = loader.get(step, k);
      zoo::Batch want = direct(*model.task, step, 1, 3, 2, k);
      EXPECT_TRUE(torch::equal(got.input, want.input)) << "step " << step << " microbatch " << k;
      EXPECT_TRUE(torch::equal(got.target, want.target)) << "step " << step << " microbatch " << k;
    }
  }
  EXPECT_EQ(loader.prefetched(), 8);  // every request but the first came from the worker
}

TEST(Batches, ARequestOutOfOrderIsMadeOnTheSpot) {
  zoo::Model model = zoo::build_model("gpt", "gpt2-tiny", {}, 0);
  Batches loader(*model.task, 0, 2, 3, true, false);
  loader.get(0, 0);  // starts (0, 1)
  zoo::Batch got = loader.get(5, 1);  // a resumed step: not the prefetched one
  EXPECT_TRUE(torch::equal(got.input, direct(*model.task, 5, 0, 2, 3, 1).input));
  EXPECT_EQ(loader.prefetched(), 0);
  got = loader.get(6, 0);  // (5, 1) was the last microbatch: (6, 0) came from the worker
  EXPECT_TRUE(torch::equal(got.input, direct(*model.task, 6, 0, 2, 3, 0).input));
  EXPECT_EQ(loader.prefetched(), 1);
}

TEST(Batches, ATaskThatCannotRunInTheBackgroundIsAskedInLine) {
  struct InLine final : zoo::Task {
    mutable int calls = 0;
    zoo::Batch batch(std::int64_t step, std::int64_t first, std::int64_t count) const override {
      ++calls;
      return {torch::full({count}, static_cast<double>(step * 100 + first)), torch::zeros({count})};
    }
    torch::Tensor loss(const torch::Tensor& o, const torch::Tensor&) const override { return o.sum(); }
    std::vector<std::int64_t> sample_shape() const override { return {}; }
  } task;
  Batches loader(task, 0, 2, 4, /*background=*/true, false);
  EXPECT_FALSE(loader.background());
  EXPECT_EQ(loader.get(3, 1).input[0].item<double>(), 304);
  EXPECT_EQ(task.calls, 1);  // nothing made ahead
}

// The images are generated in parallel over samples: the same bits as one sample at a time.
TEST(Batches, ImagesGeneratedInParallelEqualOneSampleAtATime) {
  zoo::Model model = zoo::build_model("resnet", "resnet-tiny", {}, 0);
  zoo::Batch all = model.task->batch(2, 5, 6);
  for (std::int64_t j = 0; j < 6; ++j) {
    zoo::Batch one = model.task->batch(2, 5 + j, 1);
    EXPECT_TRUE(torch::equal(all.input[j], one.input[0])) << "sample " << j;
    EXPECT_EQ(all.target[j].item<std::int64_t>(), one.target[0].item<std::int64_t>());
  }
}

}  // namespace
}  // namespace zeroplan::exec::pieces
