// FlopCounter: closed forms of flops.h applied to the ATen ops seen by a thread-local RecordFunction
// callback.
#include "zeroplan/profiles/flops.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <string_view>
#include <unordered_map>
#include <vector>

namespace zeroplan::flops {

namespace {

enum class Kind {
  kLinear,     // 2 * numel(input) * out_features
  kMatmul,     // 2 * numel(output) * k, k = last dim of the first matrix operand
  kConv,       // 2 * numel(output) * weight.numel() / Cout
  kAttention,  // 4 * numel(q) * seq_k
  kLayerNorm,
  kBatchNorm,
  kSoftmax,
  kGelu,
  kUnary,      // 1 per output element
  kPool,       // 1 per input element
};

const std::unordered_map<std::string_view, Kind>& op_table() {
  static const std::unordered_map<std::string_view, Kind> table = {
      {"aten::linear", Kind::kLinear},
      {"aten::matmul", Kind::kMatmul},
      {"aten::mm", Kind::kMatmul},
      {"aten::bmm", Kind::kMatmul},
      {"aten::addmm", Kind::kMatmul},
      {"aten::baddbmm", Kind::kMatmul},
      {"aten::conv1d", Kind::kConv},
      {"aten::conv2d", Kind::kConv},
      {"aten::conv3d", Kind::kConv},
      {"aten::convolution", Kind::kConv},
      {"aten::_convolution", Kind::kConv},
      {"aten::scaled_dot_product_attention", Kind::kAttention},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", Kind::kAttention},
      {"aten::_scaled_dot_product_efficient_attention", Kind::kAttention},
      {"aten::_scaled_dot_product_flash_attention", Kind::kAttention},
      {"aten::_scaled_dot_product_cudnn_attention", Kind::kAttention},
      {"aten::layer_norm", Kind::kLayerNorm},
      {"aten::native_layer_norm", Kind::kLayerNorm},
      {"aten::batch_norm", Kind::kBatchNorm},
      {"aten::native_batch_norm", Kind::kBatchNorm},
      {"aten::_batch_norm_impl_index", Kind::kBatchNorm},
      {"aten::softmax", Kind::kSoftmax},
      {"aten::_softmax", Kind::kSoftmax},
      {"aten::log_softmax", Kind::kSoftmax},
      {"aten::_log_softmax", Kind::kSoftmax},
      {"aten::gelu", Kind::kGelu},
      {"aten::relu", Kind::kUnary},
      {"aten::relu_", Kind::kUnary},
      {"aten::add", Kind::kUnary},
      {"aten::add_", Kind::kUnary},
      {"aten::sub", Kind::kUnary},
      {"aten::mul", Kind::kUnary},
      {"aten::mul_", Kind::kUnary},
      {"aten::div", Kind::kUnary},
      {"aten::max_pool2d", Kind::kPool},
      {"aten::avg_pool2d", Kind::kPool},
      {"aten::adaptive_avg_pool2d", Kind::kPool},
  };
  return table;
}

bool is_matmul_like(Kind k) {
  return k == Kind::kLinear || k == Kind::kMatmul || k == Kind::kConv || k == Kind::kAttention;
}

double per_element(Kind k) {
  switch (k) {
    case Kind::kLayerNorm: return kLayerNormPerElement;
    case Kind::kBatchNorm: return kBatchNormPerElement;
    case Kind::kSoftmax: return kSoftmaxPerElement;
    case Kind::kGelu: return kGeluPerElement;
    case Kind::kUnary: return 1;
    default: return 0;
  }
}

const at::Tensor* tensor_input(const at::RecordFunction& fn, std::size_t i) {
  auto inputs = fn.inputs();
  if (i < inputs.size() && inputs[i].isTensor()) return &inputs[i].toTensor();
  return nullptr;
}

struct OpContext : at::ObserverContext {
  Kind kind = Kind::kUnary;
  bool outermost = false;
  double flops = 0;            // known at start
  double per_output_elem = 0;  // times numel(first output) at end
};

}  // namespace

struct FlopCounter::State {
  Count count;
  int depth = 0;  // counted ops currently open on this thread
  at::CallbackHandle handle = 0;
};

namespace {

thread_local FlopCounter::State* t_state = nullptr;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  FlopCounter::State* state = t_state;
  if (state == nullptr) return nullptr;
  const auto& table = op_table();
  auto it = table.find(std::string_view(fn.name()));
  if (it == table.end()) return nullptr;
  auto ctx = std::make_unique<OpContext>();
  ctx->kind = it->second;
  ctx->outermost = state->depth == 0;
  ++state->depth;
  if (!ctx->outermost) return ctx;
  switch (ctx->kind) {
    case Kind::kLinear: {
      const at::Tensor* x = tensor_input(fn, 0);
      const at::Tensor* w = tensor_input(fn, 1);
      if (x != nullptr && w != nullptr && w->dim() == 2) {
        ctx->flops = 2.0 * static_cast<double>(x->numel()) * static_cast<double>(w->size(0));
      }
      break;
    }
    case Kind::kMatmul: {
      const std::string_view name(fn.name());
      const bool has_bias = name == "aten::addmm" || name == "aten::baddbmm";
      const at::Tensor* a = tensor_input(fn, has_bias ? 1 : 0);
      if (a != nullptr && a->dim() >= 1) {
        ctx->per_output_elem = 2.0 * static_cast<double>(a->size(-1));
      }
      break;
    }
    case Kind::kConv: {
      const at::Tensor* w = tensor_input(fn, 1);
      if (w != nullptr && w->dim() >= 3 && w->size(0) > 0) {
        ctx->per_output_elem = 2.0 * static_cast<double>(w->numel()) / static_cast<double>(w->size(0));
      }
      break;
    }
    case Kind::kAttention: {
      const at::Tensor* q = tensor_input(fn, 0);
      const at::Tensor* k = tensor_input(fn, 1);
      if (q != nullptr && k != nullptr && k->dim() >= 2) {
        ctx->flops = 4.0 * static_cast<double>(q->numel()) * static_cast<double>(k->size(-2));
      }
      break;
    }
    case Kind::kPool: {
      const at::Tensor* x = tensor_input(fn, 0);
      if (x != nullptr) ctx->flops = static_cast<double>(x->numel());
      break;
    }
    default:
      ctx->per_output_elem = per_element(ctx->kind);
      break;
  }
  return ctx;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* raw) {
  FlopCounter::State* state = t_state;
  if (raw == nullptr || state == nullptr) return;
  auto* ctx = static_cast<OpContext*>(raw);
  --state->depth;
  if (!ctx->outermost) return;
  double flops = ctx->flops;
  if (ctx->per_output_elem != 0) {
    const auto& outputs = fn.outputs();
    if (!outputs.empty() && outputs[0].isTensor()) {
      flops += ctx->per_output_elem * static_cast<double>(outputs[0].toTensor().numel());
    }
  }
  (is_matmul_like(ctx->kind) ? state->count.matmul : state->count.elementwise) += flops;
}

}  // namespace

FlopCounter::FlopCounter() : state_(std::make_unique<State>()) {
  TORCH_CHECK(t_state == nullptr, "one FlopCounter at a time per thread");
  t_state = state_.get();
  state_->handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                                  .needsInputs(true)
                                                  .needsOutputs(true)
                                                  .scopes({at::RecordScope::FUNCTION}));
}

FlopCounter::~FlopCounter() {
  at::removeCallback(state_->handle);
  t_state = nullptr;
}

Count FlopCounter::count() const { return state_->count; }

}  // namespace zeroplan::flops
