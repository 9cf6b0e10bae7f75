// The executor's pieces (pieces.h lists them): Activations (activations.cpp).
#pragma once

#include "context.h"
#include "activation_offload.h"

namespace zeroplan::exec::pieces {

class Activations {
 public:
  explicit Activations(Ctx& c);
  // Runs unit u's forward on x (detached into a leaf that needs grad unless it is the model's input);
  // keeps what its backward needs. Returns the output (attached to the unit's graph unless checkpointed).
  torch::Tensor forward(int u, const torch::Tensor& x, int micro);
  // The unit's output with its graph, recomputed for a checkpointed unit; and the input to differentiate.
  torch::Tensor output_for_backward(int u, int micro);
  const torch::Tensor& input(int u) const { return state_[static_cast<std::size_t>(u)].in; }
  void after_bwd(int u);  // drops the unit's activations (restores buffers a recompute changed)

 private:
  struct State {
    torch::Tensor in, out;
    Recompute recompute;
    // checkpoint_offload: the kept input on the host between the forward and the recompute.
    torch::Tensor in_host;
    std::vector<std::int64_t> in_shape;
    bool in_grad = false;
  };
  Ctx& c_;
  std::vector<State> state_;
  ActivationOffload offload_;

 public:
  const ActivationOffload& offload() const { return offload_; }
};

}  // namespace zeroplan::exec::pieces
