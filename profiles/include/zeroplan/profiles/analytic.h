// Analytic profiles: ModelProfiles from closed forms, for models too large to instantiate. No torch.
//
// GPT (GPT-2/3 style, pre-LayerNorm, learned positions, 4h MLP), h = hidden, s = seq, V = vocab,
// a = heads, b = batch, e = bytes per element of dtype (fp32 4, fp16/bf16 2). Units:
//   embed  (Embedding)        params V*h + s*h; output e*b*s*h; saves the token ids (8*b*s, int64)
//   block  (TransformerBlock) x layers (one entry, count = layers):
//          params 12h^2 + 13h; FLOPs forward 24*b*s*h^2 + 4*b*s^2*h (matmuls only), backward 2x;
//          saved s*b*h*(16e + 2) + a*s^2*b*(2e + 1) bytes: Korthikanti et al. 2022 with 16-bit tensors
//          widened to e bytes and 1-byte dropout masks kept: e = 2 gives s*b*h*(34 + 5*a*s/h) exactly,
//          e = 4 gives s*b*h*(66 + 9*a*s/h)
//   head   (Head)             final LayerNorm 2h (+ V*h when not tied); FLOPs forward 2*b*s*h*V,
//          backward 2x; saves the LayerNorm input and output (2*e*b*s*h); output e*b*s*V (logits)
// With sub_blocks each layer is two units, "block<l>.attn" (Attention: LayerNorm, QKV, attention,
// projection, dropout, residual add; params 4h^2 + 6h; saved s*b*h*(6e + 1) + the scores' a*s^2*b*(2e + 1)
// or flash's 4*a*s*b; FLOPs 8bsh^2 + 4bs^2h) then "block<l>.mlp" (MLP: LayerNorm, fc1, GELU, fc2, dropout,
// residual add; params 8h^2 + 7h; saved s*b*h*(10e + 1); FLOPs 16bsh^2): the block's figures split.
// With flash_attention the block keeps no a*s^2 scores: saved s*b*h*(16e + 2) + 4*a*s*b (the fp32
// log-sum-exp) bytes.
// Every unit lists its kernels (UnitProfile::ops, at the reference batch; T = b*s tokens), from which the
// simulator sums its time per op (sim cost_models.h op_time):
//   embed  embedding (elements 3Th and 8bs bytes of ids each way, 2 kernels each way), embed_dropout
//   block  layernorm1 (2Th; bwd 3Th, 2 kernels), qkv GEMM (T, 3h, h, bias), attention (b*a x s x s x h/a,
//          causal; fused = flash_attention, else unfused with dropout), proj GEMM (T, h, h, bias),
//          dropout1 (2Th + Th mask bytes each way), residual1 (3Th each way), layernorm2, fc1 GEMM
//          (T, 4h, h, bias), gelu (8Th; bwd 12Th), fc2 GEMM (T, h, 4h, bias), dropout2, residual2
//   head   layernorm_f, logits GEMM (T, V, h), loss (T*V elements + 12 T*V fp32 bytes each way)
// Times and transient peaks are 0 and measured = false: the simulator derives times from the ops on the
// target device. Batch figures are proportional (Figure::proportional); device "analytic", threads 1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zeroplan/profiles/model_profile.h"

namespace zeroplan {

struct AnalyticGptOptions {
  std::int64_t layers = 12;
  std::int64_t hidden = 768;
  std::int64_t heads = 12;
  std::int64_t seq = 1024;
  std::int64_t vocab = 50257;
  int batch = 1;
  std::string dtype = "fp16";  // "fp32" | "fp16" | "bf16"
  bool tied_embeddings = true;
  bool flash_attention = false;  // fused attention kernel (no s x s scores kept), else unfused
  // Attention and MLP as separate units (FSDP's auto-wrap of both), "block<l>.attn" then "block<l>.mlp"
  // per layer, instead of one "block" unit repeated `layers` times.
  bool sub_blocks = false;
  std::string name = "gpt";    // profile name
};

// Saved-activation bytes of one transformer layer (see above). REQUIRES: bytes_per_element 2 or 4.
double gpt_layer_saved_bytes(std::int64_t seq, std::int64_t batch, std::int64_t hidden,
                             std::int64_t heads, int bytes_per_element);
// The same with flash attention: s*b*h*(16e + 2) + 4*a*s*b.
double gpt_layer_saved_bytes_flash(std::int64_t seq, std::int64_t batch, std::int64_t hidden,
                                   std::int64_t heads, int bytes_per_element);
// The kernels of one transformer layer at micro batch `batch` (see above).
std::vector<UnitOp> gpt_block_ops(std::int64_t seq, std::int64_t batch, std::int64_t hidden, std::int64_t heads,
                                  bool flash_attention);
// Parameters of one transformer layer: 12h^2 + 13h.
std::int64_t gpt_layer_params(std::int64_t hidden);
// Forward FLOPs of one transformer layer: 24*b*s*h^2 + 4*b*s^2*h.
double gpt_layer_flops_fwd(std::int64_t seq, std::int64_t batch, std::int64_t hidden);

// Throws SchemaError naming the value for non-positive sizes, heads not dividing hidden, unknown dtype.
ModelProfile analytic_gpt(const AnalyticGptOptions& options);

// The options an analytic GPT profile was made with (its ops give the heads and the attention kernel),
// or nullopt when `profile` is not exactly analytic_gpt() of some options (another source, edited
// figures, no ops).
std::optional<AnalyticGptOptions> analytic_gpt_options_of(const ModelProfile& profile);

// UnitOp builders shared by the analytic families: a GEMM C[m,n] = A[m,k] B[k,n], and a memory-bound op.
UnitOp gemm_op(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, bool bias);
UnitOp memory_op(const char* name, double elems_fwd, double bytes_fwd, int kernels_fwd, double elems_bwd,
                 double bytes_bwd, int kernels_bwd);

// Bytes per element of "fp32" (4), "fp16" / "bf16" (2); throws SchemaError otherwise.
int dtype_bytes(const std::string& dtype);

}  // namespace zeroplan

namespace zeroplan {

// Decoder families beside GPT (analytic_decoder.cpp), h = hidden, a = heads, g = kv_heads, d = head_dim,
// I = intermediate, V = vocab, T = batch x seq tokens, e = bytes per element:
//   llama  (Llama, Mistral, Qwen2): RMSNorm (weight only), grouped-query attention (q: h x a*d, k and v:
//          h x g*d, o: a*d x h; q/k/v biases with qkv_bias, as Qwen2), rotary positions (no parameters),
//          SwiGLU MLP with three matrices (gate, up: h x I; down: I x h), untied head unless tied.
//          Per layer: 2h + h*a*d + 2*h*g*d + a*d*h + 3*h*I (+ a*d + 2*g*d biases).
//          Saved per layer: e*T*(6h + 2*a*d + 4I) + 8T (the two RMSNorms' fp32 statistics) and the
//          attention scores a*s*s*b*(4 + e) (HF eager: fp32 softmax output, its cast kept for the AV
//          product), or with flash attention 4*a*s*b (the log-sum-exp) and k, v unexpanded (2*g*d).
//   mpt    (MPT): LayerNorms without bias, fused Wqkv h x 3h and out h x h, no biases, ALiBi (no position
//          parameters), MLP h x rI x h with GELU (r = expansion_ratio, I = r*h), head tied to the token
//          embedding. Per layer: 2h + 4h^2 + 2*r*h^2. Saved e*T*h*(8 + 2r) + a*s*s*b*(4 + e) (flash:
//          4*a*s*b). With biases (MPTConfig no_bias false, llm-foundry's default) every LayerNorm and
//          linear has one: + 7h + I per layer and h for the final norm. With learned positions
//          (llm-foundry's learned_pos_emb, instead of ALiBi) the embedding adds a max_seq_len x h table.
// Units: embed (V*h), block x layers, head (final norm, + V*h when not tied, with the loss), as the GPT's.
// Parameter counts equal the transformers models built from the same configs (tests/python).
struct AnalyticDecoderOptions {
  std::string family = "llama";  // "llama" | "mpt"
  std::int64_t layers = 32;
  std::int64_t hidden = 4096;
  std::int64_t intermediate = 11008;  // llama: the MLP's width; mpt: expansion_ratio x hidden
  std::int64_t heads = 32;
  std::int64_t kv_heads = 0;          // 0: heads (no grouping)
  std::int64_t head_dim = 0;          // 0: hidden / heads
  std::int64_t seq = 2048;
  std::int64_t vocab = 32000;
  int batch = 1;
  std::string dtype = "bf16";
  bool tied_embeddings = false;       // llama: tie_word_embeddings; mpt: always tied
  bool qkv_bias = false;              // Qwen2
  bool biases = false;                // mpt: biases on every LayerNorm and linear (no_bias false)
  std::int64_t learned_positions = 0; // mpt: rows of a learned position table (max_seq_len), 0: ALiBi
  bool flash_attention = false;
  // Attention and MLP halves as separate units, "block<l>.attn" then "block<l>.mlp" (as the GPT's
  // sub_blocks): parameters, saved bytes, FLOPs and ops split, the layer their sum.
  bool sub_blocks = false;
  std::string name = "llama";
  std::string source;                 // "" = "analytic:<family>"
};

// Throws SchemaError naming the value for non-positive sizes, heads not a multiple of kv_heads, an
// unknown family or dtype.
ModelProfile analytic_decoder(const AnalyticDecoderOptions& options);

// A Hugging Face config.json's model (LlamaConfig, MistralConfig, Qwen2Config: family llama; MptConfig:
// mpt; GPT2Config: gpt), at `batch`, `seq` (0: the config's max_position_embeddings / n_positions /
// max_seq_len, capped at 4096) and `dtype`. `origin` names the file in errors; a config of another
// model_type is refused with the list of those read. `sub_blocks`: each layer as its attention and MLP
// units (the families' sub_blocks).
ModelProfile analytic_from_hf_config(const std::string& config_json, const std::string& origin, int batch,
                                     std::int64_t seq, const std::string& dtype, bool flash_attention,
                                     bool sub_blocks = false);

}  // namespace zeroplan
