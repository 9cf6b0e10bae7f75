// The executor's pieces (pieces.h lists them): AdaScale (adascale.cpp).
#pragma once

#include "context.h"
#include "grad_sync.h"

namespace zeroplan::exec::pieces {

// fairscale AdaScale (SGD): per rank the squared norms of each microbatch's gradient, one small
// all-reduce with the final gradient's squared norm; the gain from AdaScaleGain (optimizer.h).
class AdaScale {
 public:
  explicit AdaScale(Ctx& c);
  void begin_step();
  // A unit's gradient of parameter slot `offset` from this microbatch's backward (`g` as autograd
  // returned it); tied weights: a borrower's part waits for the owner's (the norm is of their sum).
  void own(int u, std::int64_t offset, const torch::Tensor& g);
  void borrowed(int owner, std::int64_t offset, const torch::Tensor& g);
  // After the gradients are final: updates the averages, returns the gain for this step (1 when there is
  // a single gradient sample: one rank, one microbatch).
  double finish(GradSync& grads);

 private:
  Ctx& c_;
  AdaScaleGain gain_;
  torch::Tensor local_sqr_;  // this step, fp64
  std::map<std::pair<int, std::int64_t>, torch::Tensor> tied_;
};

}  // namespace zeroplan::exec::pieces
