// FLOP closed forms per layer type, and a counter that applies them to the ATen ops a forward runs.
//
// What is counted (one multiply-add = 2 FLOPs; forward):
//   Linear              2 * in * out per token                    (bias add not counted)
//   attention           4 * s_q * s_k * h per sequence            (QK^T and AV; softmax counted apart;
//                                                                   full square even when causal)
//   conv                2 * (Cin / groups) * Cout * kh * kw * Hout * Wout per sample
//   matmul/mm/bmm       2 * m * k * n per batch entry
//   elementwise         per output element: layer_norm 5, batch_norm 5, softmax/log_softmax 5, gelu 8,
//                       relu 1, add/sub/mul/div 1, pooling 1 per input element; others 0
//   embedding, views, copies: 0
// Backward: 2x forward for matmul-like ops (grad input and grad weight), 1x for elementwise ones.
//
// FlopCounter counts at the ATen dispatcher (a thread-local at::RecordFunction callback), so it covers
// any composition of modules (built-in, TorchScript); an op nested inside a counted op (linear ->
// addmm, conv2d -> convolution -> mkldnn_convolution) is counted once, at the outermost.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace zeroplan::flops {

inline double linear(double tokens, double in, double out) { return 2.0 * tokens * in * out; }
inline double attention(double batch, double seq_q, double seq_k, double hidden) {
  return 4.0 * batch * seq_q * seq_k * hidden;
}
inline double conv2d(double batch, double cin, double cout, double kh, double kw, double hout,
                     double wout, double groups = 1) {
  return 2.0 * batch * (cin / groups) * cout * kh * kw * hout * wout;
}

inline constexpr double kLayerNormPerElement = 5;
inline constexpr double kBatchNormPerElement = 5;
inline constexpr double kSoftmaxPerElement = 5;
inline constexpr double kGeluPerElement = 8;
inline constexpr double kBackwardMatmulFactor = 2;
inline constexpr double kBackwardElementwiseFactor = 1;

struct Count {
  double matmul = 0;       // matmul-like: linear, mm, bmm, conv, attention
  double elementwise = 0;  // normalisation, activations, arithmetic, pooling
  double forward() const { return matmul + elementwise; }
  double backward() const {
    return kBackwardMatmulFactor * matmul + kBackwardElementwiseFactor * elementwise;
  }
};

// Counts the ops run on the constructing thread while it is alive. One at a time per thread.
class FlopCounter {
 public:
  FlopCounter();
  ~FlopCounter();
  FlopCounter(const FlopCounter&) = delete;
  FlopCounter& operator=(const FlopCounter&) = delete;
  Count count() const;

  struct State;  // opaque

 private:
  std::unique_ptr<State> state_;
};

}  // namespace zeroplan::flops
