// The executor's pieces (pieces.h lists them): Precision (precision.cpp).
#pragma once

#include "context.h"

namespace zeroplan::exec::pieces {

class Precision {
 public:
  explicit Precision(Ctx& c);
  double loss_scale() const { return scaler_.scale(); }  // multiplies the loss gradient this step
  // This rank's final gradients, as the optimizer reads them, unscaled in place; true when some rank saw
  // an inf/NaN (dynamic scaling): every rank then skips the step.
  bool unscale_and_check(const std::vector<torch::Tensor>& grads);
  // The same check on gradients that keep their scale (16-bit, read chunk by chunk into fp32 by the
  // master's step); unscale_factor(): what such a chunk is multiplied by (undefined: no loss scaling).
  bool check(const std::vector<torch::Tensor>& grads);
  torch::Tensor unscale_factor() const { return scaler_.enabled() ? scaler_.inv_scale() : torch::Tensor(); }
  void after_step(bool skipped) { scaler_.update(skipped); }
  LossScaler& scaler() { return scaler_; }

 private:
  Ctx& c_;
  LossScaler scaler_;
};

}  // namespace zeroplan::exec::pieces
