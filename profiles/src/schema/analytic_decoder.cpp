// Analytic Llama-family and MPT profiles, and Hugging Face config.json reading (analytic.h). No torch.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <zeroplan/config.h>

#include "zeroplan/profiles/analytic.h"
#include "zeroplan/profiles/errors.h"

namespace zeroplan {
namespace {

constexpr auto gemm = gemm_op;      // the shared builders (analytic.h), short names for the op lists
constexpr auto memory = memory_op;

// The sizes of one decoder layer.
struct Layer {
  std::int64_t h, a, g, d, I;
  bool llama, qkv_bias, biases;  // qkv_bias: llama's q/k/v; biases: mpt's every norm and linear
  // The attention half (norm, projections, attention, residual) and the MLP half (norm, MLP, residual)
  // of a layer; the layer is their sum.
  std::int64_t attn_params() const {
    if (!llama) return h + 4 * h * h + (biases ? 5 * h : 0);
    return h + h * a * d + 2 * h * g * d + a * d * h + (qkv_bias ? a * d + 2 * g * d : 0);
  }
  std::int64_t mlp_params() const { return llama ? h + 3 * h * I : h + 2 * h * I + (biases ? 2 * h + I : 0); }
  std::int64_t params() const { return attn_params() + mlp_params(); }
  double attn_flops_fwd(double b, double s) const {  // matmuls: projections, QK^T and AV
    const double proj = llama ? double(h * a * d + 2 * h * g * d + a * d * h) : double(4 * h * h);
    return 2 * b * s * proj + 4 * b * s * s * double(a * d);
  }
  double mlp_flops_fwd(double b, double s) const { return 2 * b * s * (llama ? 3.0 : 2.0) * double(h * I); }
  double flops_fwd(double b, double s) const { return attn_flops_fwd(b, s) + mlp_flops_fwd(b, s); }
  // Saved bytes: llama's attention half keeps its norm's input and output, q and the attention output
  // (4h), k and v, the norm's fp32 statistics and the scores; its MLP half the norm's input and output
  // (2h), gate, up, the SiLU output and the product (4I) and the statistics. MPT's attention half 6h
  // (norm input and output, q, k, v, attention output) and the scores, its MLP half 2h + 2I.
  double attn_saved(double b, double s, int e, bool flash) const {
    const double T = b * s;
    const double scores = flash ? 4.0 * double(a) * s * b : double(a) * s * s * b * (4.0 + e);
    if (!llama) return e * T * 6.0 * double(h) + scores;
    const double kv = flash ? 2.0 * double(g * d) : 2.0 * double(a * d);  // eager expands k, v to a heads
    return e * T * (4.0 * double(h) + kv) + 4 * T + scores;
  }
  double mlp_saved(double b, double s, int e) const {
    const double T = b * s;
    if (!llama) return e * T * (2.0 * double(h) + 2.0 * double(I));
    return e * T * (2.0 * double(h) + 4.0 * double(I)) + 4 * T;
  }
  double saved(double b, double s, int e, bool flash) const { return attn_saved(b, s, e, flash) + mlp_saved(b, s, e); }
  // How many of ops() belong to the attention half (the rest are the MLP's).
  static std::size_t attn_ops(bool llama_layer, bool alibi) { return llama_layer ? 6 : (alibi ? 6 : 5); }
  std::vector<UnitOp> ops(std::int64_t seq, std::int64_t batch, bool flash, bool alibi) const {
    const std::int64_t T = seq * batch;
    const double Th = double(T) * double(h), TI = double(T) * double(I);
    const UnitOp attention{.kind = "attention", .name = "attention", .m = seq, .n = seq, .k = d, .batch = batch * a,
                           .fused = flash, .causal = true, .dropout = false};
    if (!llama) {
      std::vector<UnitOp> ops{memory("layernorm1", 2 * Th, 0, 1, 3 * Th, 0, 2), gemm("qkv", T, 3 * h, h, biases),
                              attention};
      if (alibi) ops.push_back(memory("alibi", double(batch * a) * double(seq) * double(seq), 0, 1, 0, 0, 0));
      for (UnitOp op : {gemm("out", T, h, h, biases), memory("residual1", 3 * Th, 0, 1, 3 * Th, 0, 1),
                        memory("layernorm2", 2 * Th, 0, 1, 3 * Th, 0, 2), gemm("up", T, I, h, biases),
                        memory("gelu", 2 * TI, 0, 1, 3 * TI, 0, 1), gemm("down", T, h, I, biases),
                        memory("residual2", 3 * Th, 0, 1, 3 * Th, 0, 1)})
        ops.push_back(op);
      return ops;
    }
    const double Tq = double(T) * double((a + 2 * g) * d);
    return {memory("rmsnorm1", 2 * Th, 0, 2, 3 * Th, 0, 3), gemm("qkv", T, (a + 2 * g) * d, h, qkv_bias),
            memory("rotary", 2 * Tq, 0, 2, 2 * Tq, 0, 2), attention, gemm("o", T, h, a * d, false),
            memory("residual1", 3 * Th, 0, 1, 3 * Th, 0, 1), memory("rmsnorm2", 2 * Th, 0, 2, 3 * Th, 0, 3),
            gemm("gate_up", T, 2 * I, h, false), memory("silu_mul", 3 * TI, 0, 2, 5 * TI, 0, 2),
            gemm("down", T, h, I, false), memory("residual2", 3 * Th, 0, 1, 3 * Th, 0, 1)};
  }
};

}  // namespace

ModelProfile analytic_decoder(const AnalyticDecoderOptions& o) {
  const std::string& f = o.family;
  if (f != "llama" && f != "mpt")
    throw SchemaError(fmt::format("analytic: unknown family \"{}\" (families: gpt, llama, mpt)", f));
  const auto positive = [&](const char* what, std::int64_t v) {
    if (v < 1) throw SchemaError(fmt::format("analytic {}: {} must be >= 1 (got {})", f, what, v));
  };
  positive("layers", o.layers);
  positive("hidden", o.hidden);
  positive("intermediate", o.intermediate);
  positive("heads", o.heads);
  positive("seq", o.seq);
  positive("vocab", o.vocab);
  positive("batch", o.batch);
  const std::int64_t g = o.kv_heads > 0 ? o.kv_heads : o.heads;
  if (o.heads % g != 0)
    throw SchemaError(fmt::format("analytic {}: heads {} is not a multiple of kv_heads {}", f, o.heads, g));
  if (o.head_dim == 0 && o.hidden % o.heads != 0)
    throw SchemaError(fmt::format("analytic {}: hidden {} is not a multiple of heads {}", f, o.hidden, o.heads));
  const int e = dtype_bytes(o.dtype);
  const bool llama = f == "llama";
  if (o.learned_positions < 0 || (llama && (o.learned_positions > 0 || o.biases)))
    throw SchemaError(fmt::format("analytic {}: biases and learned positions are mpt options (learned positions {})", f,
                                  o.learned_positions));
  const Layer L{o.hidden, o.heads, g, o.head_dim > 0 ? o.head_dim : o.hidden / o.heads, o.intermediate, llama,
                llama && o.qkv_bias, !llama && o.biases};
  const bool tied = llama ? o.tied_embeddings : true;
  const std::int64_t b = o.batch, s = o.seq, h = o.hidden, V = o.vocab;
  const double bd = double(b), sd = double(s), hd = double(h), vd = double(V);
  const auto prop = [&](double v) { return Figure::proportional(v, bd); };

  ModelProfile p;
  p.name = o.name;
  p.source = o.source.empty() ? "analytic:" + f : o.source;
  p.measured = false;
  p.device = "analytic";
  p.dtype = o.dtype;
  p.threads = 1;
  p.library_versions = {{"zeroplan", ZEROPLAN_VERSION}};
  p.batch = o.batch;
  p.seq_len = s;
  p.input_shape = {b, s};

  const double Th = bd * sd * hd, TV = bd * sd * vd;
  UnitProfile embed;
  embed.name = "embed";
  embed.type = "Embedding";
  embed.params = V * h + o.learned_positions * h;  // rotary and ALiBi positions have no parameters
  embed.input_shape = {b, s};
  embed.output_shape = {b, s, h};
  embed.bytes_saved = prop(8 * bd * sd);
  embed.bytes_output = prop(e * Th);
  embed.ops = {memory("embedding", 2 * Th, 8 * bd * sd, 1, 2 * Th, 8 * bd * sd, 1)};

  UnitProfile block;
  block.name = "block";
  block.type = llama ? "LlamaDecoderLayer" : "MptBlock";
  block.count = static_cast<int>(o.layers);
  block.params = L.params();
  block.input_shape = {b, s, h};
  block.output_shape = {b, s, h};
  block.bytes_saved = prop(L.saved(bd, sd, e, o.flash_attention));
  block.bytes_output = prop(e * Th);
  block.flops_fwd = prop(L.flops_fwd(bd, sd));
  block.flops_bwd = prop(2 * L.flops_fwd(bd, sd));
  block.ops = L.ops(s, b, o.flash_attention, o.learned_positions == 0);
  std::vector<UnitProfile> blocks;
  if (o.sub_blocks) {  // FSDP wrapping attention and MLP apart: "block<l>.attn" then "block<l>.mlp"
    const std::size_t split = Layer::attn_ops(llama, o.learned_positions == 0);
    for (std::int64_t l = 0; l < o.layers; ++l) {
      UnitProfile attn = block, mlp = block;
      attn.name = fmt::format("block{}.attn", l);
      attn.type = "Attention";
      attn.count = 1;
      attn.params = L.attn_params();
      attn.bytes_saved = prop(L.attn_saved(bd, sd, e, o.flash_attention));
      attn.flops_fwd = prop(L.attn_flops_fwd(bd, sd));
      attn.flops_bwd = prop(2 * L.attn_flops_fwd(bd, sd));
      attn.ops.assign(block.ops.begin(), block.ops.begin() + static_cast<std::ptrdiff_t>(split));
      mlp.name = fmt::format("block{}.mlp", l);
      mlp.type = "MLP";
      mlp.count = 1;
      mlp.params = L.mlp_params();
      mlp.bytes_saved = prop(L.mlp_saved(bd, sd, e));
      mlp.flops_fwd = prop(L.mlp_flops_fwd(bd, sd));
      mlp.flops_bwd = prop(2 * L.mlp_flops_fwd(bd, sd));
      mlp.ops.assign(block.ops.begin() + static_cast<std::ptrdiff_t>(split), block.ops.end());
      blocks.push_back(std::move(attn));
      blocks.push_back(std::move(mlp));
    }
  } else {
    blocks.push_back(std::move(block));
  }

  UnitProfile head;
  head.name = "head";
  head.type = "Head";
  head.params = h + (L.biases ? h : 0) + (tied ? 0 : V * h);
  head.input_shape = {b, s, h};
  head.output_shape = {b, s, V};
  const double logits = e * TV, loss_fp32 = 4 * TV;
  head.bytes_saved = prop(2.0 * e * Th + logits);
  head.bytes_output = prop(logits);
  head.bytes_peak_fwd = prop(2.0 * e * Th + 2 * logits + 2 * loss_fp32);
  head.flops_fwd = prop(2 * Th * vd);
  head.flops_bwd = prop(4 * Th * vd);
  if (tied) head.borrowed.push_back({0, V * h});
  head.ops = {memory(llama ? "rmsnorm_f" : "layernorm_f", 2 * Th, 0, 1, 3 * Th, 0, 2), gemm("logits", b * s, V, h, false),
              memory("loss", TV, 12 * TV, 3, TV, 12 * TV, 2)};

  std::vector<UnitProfile*> units{&embed};
  for (UnitProfile& u : blocks) units.push_back(&u);
  units.push_back(&head);
  for (UnitProfile* u : units) {
    u->bytes_param = u->params * e;
    p.units.push_back(std::move(*u));
  }
  validate(p);
  return p;
}

ModelProfile analytic_from_hf_config(const std::string& text, const std::string& origin, int batch, std::int64_t seq,
                                     const std::string& dtype, bool flash_attention,
                                     bool sub_blocks) {
  nlohmann::json c;
  try {
    c = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& err) {
    throw SchemaError(fmt::format("{}: not JSON ({})", origin, err.what()));
  }
  if (!c.is_object()) throw SchemaError(fmt::format("{}: not a Hugging Face config (a JSON object)", origin));
  const std::string type = c.value("model_type", "");
  auto need = [&](const char* key) -> std::int64_t {
    if (!c.contains(key) || !c[key].is_number_integer())
      throw SchemaError(fmt::format("{}: model_type {} needs an integer \"{}\"", origin, type, key));
    return c[key].get<std::int64_t>();
  };
  auto seq_or = [&](std::int64_t configured) { return seq > 0 ? seq : std::min<std::int64_t>(configured, 4096); };
  const std::string name = c.contains("_name_or_path") && c["_name_or_path"].is_string()
                               ? c["_name_or_path"].get<std::string>() : type;
  if (type == "gpt2") {
    AnalyticGptOptions o;
    o.layers = need("n_layer");
    o.hidden = need("n_embd");
    o.heads = need("n_head");
    o.vocab = need("vocab_size");
    o.seq = seq_or(need("n_positions"));
    o.batch = batch;
    o.dtype = dtype;
    o.tied_embeddings = c.value("tie_word_embeddings", true);
    o.flash_attention = flash_attention;
    o.sub_blocks = sub_blocks;
    o.name = name;
    if (o.seq > need("n_positions") || (c.contains("n_inner") && c["n_inner"].is_number() &&
                                        c["n_inner"].get<std::int64_t>() != 4 * o.hidden))
      throw SchemaError(fmt::format("{}: gpt2 with n_inner other than 4 x n_embd, or seq above n_positions {}, is not "
                                    "modelled", origin, need("n_positions")));
    ModelProfile p = analytic_gpt(o);
    // GPT-2's position table has n_positions rows whatever the training sequence length.
    p.units.front().params = o.vocab * o.hidden + need("n_positions") * o.hidden;
    p.units.front().bytes_param = p.units.front().params * dtype_bytes(dtype);
    p.source = "analytic:gpt from " + origin;
    return p;
  }
  AnalyticDecoderOptions o;
  o.batch = batch;
  o.dtype = dtype;
  o.flash_attention = flash_attention;
  o.sub_blocks = sub_blocks;
  o.name = name;
  o.source = "analytic:" + type + " from " + origin;
  if (type == "llama" || type == "mistral" || type == "qwen2") {
    o.family = "llama";
    o.layers = need("num_hidden_layers");
    o.hidden = need("hidden_size");
    o.intermediate = need("intermediate_size");
    o.heads = need("num_attention_heads");
    o.kv_heads = c.contains("num_key_value_heads") && c["num_key_value_heads"].is_number_integer()
                     ? c["num_key_value_heads"].get<std::int64_t>() : o.heads;
    if (c.contains("head_dim") && c["head_dim"].is_number_integer()) o.head_dim = c["head_dim"].get<std::int64_t>();
    o.vocab = need("vocab_size");
    o.seq = seq_or(need("max_position_embeddings"));
    o.tied_embeddings = c.value("tie_word_embeddings", false);
    // Qwen2 has q/k/v biases; Llama's attention_bias adds them to o_proj too, which is not modelled.
    o.qkv_bias = type == "qwen2";
    if (c.value("attention_bias", false) || c.value("mlp_bias", false))
      throw SchemaError(fmt::format("{}: attention_bias / mlp_bias are not modelled", origin));
    return analytic_decoder(o);
  }
  if (type == "mpt") {
    o.family = "mpt";
    o.layers = need("n_layers");
    o.hidden = need("d_model");
    o.heads = need("n_heads");
    o.vocab = need("vocab_size");
    o.seq = seq_or(need("max_seq_len"));
    o.intermediate = need("expansion_ratio") * o.hidden;
    if (!c.value("no_bias", true)) throw SchemaError(fmt::format("{}: mpt with biases (no_bias false) is not modelled", origin));
    return analytic_decoder(o);
  }
  throw SchemaError(fmt::format("{}: model_type \"{}\" is not read (read: gpt2, llama, mistral, qwen2, mpt)", origin,
                                type.empty() ? "(none)" : type));
}

}  // namespace zeroplan
