// gpt: GPT-2-style pre-LayerNorm decoder. Units: embed (wte + wpe), block0..block{L-1}, head (ln_f and
// the LM head, which by default borrows embed's wte.weight). Parameter names follow nanoGPT/HF GPT-2.
// With units=sub-block each block is two units, block<l>.attn (x + attn(ln_1(x))) then block<l>.mlp
// (x + mlp(ln_2(x))), as FSDP auto-wrap policies that wrap attention and MLP apart cut it (the analytic
// gpt's --opt units=sub-block); same parameters, same arithmetic.
// Task: next-token prediction on a fixed random Markov chain (learnable: low conditional entropy).
#include "zoo_impl.h"

#include <zeroplan/profiles/errors.h>

#include <cmath>

namespace zeroplan::zoo::detail {
namespace {

namespace F = torch::nn::functional;

struct GptConfig {
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t seq = 0;        // training sequence length (the task's)
  int64_t positions = 0;  // rows of the position table wpe; >= seq
  int64_t vocab = 0;
  bool tied = true;
  double dropout = 0.0;
};

// Input: token ids [batch, T] (int64), T <= positions. Output: [batch, T, hidden].
class EmbedUnit : public UnitModule {
 public:
  explicit EmbedUnit(const GptConfig& c)
      : wte(register_module("wte", torch::nn::Embedding(c.vocab, c.hidden))),
        wpe(register_module("wpe", torch::nn::Embedding(c.positions, c.hidden))),
        drop(register_module("drop", torch::nn::Dropout(c.dropout))),
        positions_(c.positions) {}
  torch::Tensor forward(const torch::Tensor& input) override {
    TORCH_CHECK(input.dim() == 2 && input.size(1) <= positions_, "gpt embed: expected token ids [batch, T<=",
                positions_, "], got ", input.sizes());
    torch::Tensor positions = torch::arange(input.size(1), input.options().dtype(torch::kInt64));
    return drop(wte(input) + wpe(positions));
  }
  torch::nn::Embedding wte;
  torch::nn::Embedding wpe;
  torch::nn::Dropout drop;

 private:
  int64_t positions_;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& c)
      : c_attn(register_module("c_attn", torch::nn::Linear(c.hidden, 3 * c.hidden))),
        c_proj(register_module("c_proj", torch::nn::Linear(c.hidden, c.hidden))),
        resid_drop(register_module("resid_drop", torch::nn::Dropout(c.dropout))),
        heads_(c.heads),
        dropout_(c.dropout) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t batch = x.size(0), time = x.size(1), hidden = x.size(2);
    std::vector<torch::Tensor> qkv = c_attn(x).split(hidden, /*dim=*/2);
    auto heads = [&](const torch::Tensor& t) {
      return t.view({batch, time, heads_, hidden / heads_}).transpose(1, 2);
    };
    torch::Tensor y = at::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), {},
                                                       is_training() ? dropout_ : 0.0, /*is_causal=*/true);
    y = y.transpose(1, 2).contiguous().view({batch, time, hidden});
    return resid_drop(c_proj(y));
  }
  torch::nn::Linear c_attn;
  torch::nn::Linear c_proj;
  torch::nn::Dropout resid_drop;

 private:
  int64_t heads_;
  double dropout_;
};
TORCH_MODULE(CausalSelfAttention);

class GptMlpImpl : public torch::nn::Module {
 public:
  explicit GptMlpImpl(const GptConfig& c)
      : c_fc(register_module("c_fc", torch::nn::Linear(c.hidden, 4 * c.hidden))),
        c_proj(register_module("c_proj", torch::nn::Linear(4 * c.hidden, c.hidden))),
        drop(register_module("drop", torch::nn::Dropout(c.dropout))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return drop(c_proj(torch::gelu(c_fc(x), "tanh")));
  }
  torch::nn::Linear c_fc;
  torch::nn::Linear c_proj;
  torch::nn::Dropout drop;
};
TORCH_MODULE(GptMlp);

// x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class BlockUnit : public UnitModule {
 public:
  explicit BlockUnit(const GptConfig& c)
      : ln_1(register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})))),
        attn(register_module("attn", CausalSelfAttention(c))),
        ln_2(register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})))),
        mlp(register_module("mlp", GptMlp(c))) {}
  torch::Tensor forward(const torch::Tensor& input) override {
    torch::Tensor x = input + attn(ln_1(input));
    return x + mlp(ln_2(x));
  }
  torch::nn::LayerNorm ln_1;
  CausalSelfAttention attn;
  torch::nn::LayerNorm ln_2;
  GptMlp mlp;
};

// Sub-block units: the two halves of BlockUnit, with its parameter names.
class AttentionUnit : public UnitModule {
 public:
  explicit AttentionUnit(const GptConfig& c)
      : ln_1(register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})))),
        attn(register_module("attn", CausalSelfAttention(c))) {}
  torch::Tensor forward(const torch::Tensor& input) override { return input + attn(ln_1(input)); }
  torch::nn::LayerNorm ln_1;
  CausalSelfAttention attn;
};

class MlpUnit : public UnitModule {
 public:
  explicit MlpUnit(const GptConfig& c)
      : ln_2(register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})))),
        mlp(register_module("mlp", GptMlp(c))) {}
  torch::Tensor forward(const torch::Tensor& input) override { return input + mlp(ln_2(input)); }
  torch::nn::LayerNorm ln_2;
  GptMlp mlp;
};

// ln_f, then logits = x W^T with W either embed's wte.weight (tied: read from the owner module at every
// forward, never registered here) or this unit's own lm_head.weight.
class GptHeadUnit : public UnitModule {
 public:
  GptHeadUnit(const GptConfig& c, std::shared_ptr<EmbedUnit> tied_to)
      : ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})))),
        tied_to_(std::move(tied_to)) {
    if (!tied_to_) lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.hidden, c.vocab).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor& input) override {
    torch::Tensor x = ln_f(input);
    return tied_to_ ? F::linear(x, tied_to_->wte->weight) : lm_head(x);
  }
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear lm_head{nullptr};

 private:
  std::shared_ptr<EmbedUnit> tied_to_;
};

// Token t+1 follows token t by a fixed random chain: each token has kSuccessors successors (skewed
// towards small ids) with fixed probabilities, so the best loss is about 1.2 nats. Samples are generated
// one by one from Rng(sample_key(seed, step, j)); input = tokens [0, seq), target = tokens [1, seq].
class MarkovLanguage : public Task {
 public:
  static constexpr int kSuccessors = 4;
  MarkovLanguage(uint64_t seed, int64_t vocab, int64_t seq)
      : seed_(seed), vocab_(vocab), seq_(seq), successors_(static_cast<size_t>(vocab * kSuccessors)) {
    Rng rng(teacher_key(seed));
    for (int64_t& s : successors_) {
      const double u = rng.uniform();
      s = std::min<int64_t>(vocab - 1, static_cast<int64_t>(u * u * static_cast<double>(vocab)));
    }
  }

  Batch batch(int64_t step, int64_t first_sample, int64_t count) const override {
    TORCH_CHECK(step >= 0 && first_sample >= 0 && count >= 1, "gpt task: bad batch request");
    static constexpr double kCumulative[kSuccessors] = {0.5, 0.75, 0.9, 1.0};
    torch::Tensor tokens = torch::empty({count, seq_ + 1}, torch::kInt64);
    auto tok = tokens.accessor<int64_t, 2>();
    for (int64_t j = 0; j < count; ++j) {
      Rng rng(sample_key(seed_, step, first_sample + j));
      int64_t current = rng.below(vocab_);
      tok[j][0] = current;
      for (int64_t t = 1; t <= seq_; ++t) {
        const double u = rng.uniform();
        int k = 0;
        while (k + 1 < kSuccessors && u >= kCumulative[k]) ++k;
        current = successors_[static_cast<size_t>(current * kSuccessors + k)];
        tok[j][t] = current;
      }
    }
    return {tokens.narrow(1, 0, seq_).contiguous(), tokens.narrow(1, 1, seq_).contiguous()};
  }

  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const override {
    return F::cross_entropy(output.reshape({-1, output.size(-1)}), target.reshape({-1}).to(output.device()));
  }

  std::vector<int64_t> sample_shape() const override { return {seq_}; }
  bool batches_in_background() const override { return true; }

 private:
  uint64_t seed_;
  int64_t vocab_;
  int64_t seq_;
  std::vector<int64_t> successors_;  // vocab x kSuccessors
};

void init_normal(torch::nn::Linear& linear, double std, at::Generator& gen) {
  linear->weight.normal_(0.0, std, gen);
  if (linear->bias.defined()) linear->bias.zero_();
}

}  // namespace

std::unique_ptr<Task> make_markov_language(uint64_t seed, int64_t vocab, int64_t seq) {
  return std::make_unique<MarkovLanguage>(seed, vocab, seq);
}

ModelInfo gpt_info() {
  // GPT-2's position table has 1024 rows whatever the training sequence length (--seq).
  auto preset = [](const char* layers, const char* hidden, const char* heads, const char* seq,
                   const char* vocab, const char* positions = "1024") {
    return Options{{"layers", layers}, {"hidden", hidden}, {"heads", heads}, {"seq", seq},
                   {"positions", positions}, {"vocab", vocab}};
  };
  return {"gpt",
          "GPT-2-style pre-LayerNorm decoder with causal self-attention; task: next token of a random Markov chain",
          {{"layers", "2", "transformer blocks"},
           {"hidden", "64", "hidden size (divisible by heads)"},
           {"heads", "2", "attention heads"},
           {"seq", "32", "training sequence length (the task's)"},
           {"positions", "0", "rows of the position table wpe (0: seq); must be >= seq"},
           {"vocab", "256", "vocabulary size"},
           {"tied", "true", "LM head reuses the token embedding (wte.weight)"},
           {"dropout", "0", "dropout probability (embeddings, attention, residual)"},
           {"units", "block", "block: one unit per transformer block; sub-block: attention and MLP apart (FSDP's wrap)"}},
          {{"gpt2-tiny", preset("2", "64", "2", "32", "256", "32")},
           {"gpt2-small", preset("12", "768", "12", "1024", "50257")},
           {"gpt2-medium", preset("24", "1024", "16", "1024", "50257")},
           {"gpt2-large", preset("36", "1280", "20", "1024", "50257")},
           {"gpt2-xl", preset("48", "1600", "25", "1024", "50257")}}};
}

Model build_gpt(const Options& options, uint64_t seed, bool options_only) {
  GptConfig c;
  c.layers = int_option("gpt", options, "layers");
  c.hidden = int_option("gpt", options, "hidden");
  c.heads = int_option("gpt", options, "heads");
  c.seq = int_option("gpt", options, "seq");
  c.positions = int_option("gpt", options, "positions", 0);
  if (c.positions == 0) c.positions = c.seq;
  if (c.positions < c.seq) {
    throw SchemaError(c10::str("model gpt: seq ", c.seq, " is longer than the position table (positions ",
                               c.positions, ")"));
  }
  c.vocab = int_option("gpt", options, "vocab", 2);
  c.tied = bool_option("gpt", options, "tied");
  c.dropout = double_option("gpt", options, "dropout", 0.0, 1.0);
  const bool sub_blocks = choice_option("gpt", options, "units", {"block", "sub-block"}) == "sub-block";
  if (c.hidden % c.heads != 0) {
    throw SchemaError(c10::str("model gpt: hidden ", c.hidden, " is not divisible by heads ", c.heads));
  }
  if (options_only) return {};  // check_options: the options parsed and checked, nothing built

  // GPT-2 initialisation: N(0, 0.02) weights, zero biases, residual projections scaled by 1/sqrt(2L).
  at::Generator gen = param_generator(seed);
  const double std = 0.02;
  const double proj_std = std / std::sqrt(2.0 * static_cast<double>(c.layers));
  Model model;
  auto embed = std::make_shared<EmbedUnit>(c);
  embed->wte->weight.normal_(0.0, std, gen);
  embed->wpe->weight.normal_(0.0, std, gen);
  model.units.push_back({"embed", "Embedding", embed, {}});
  for (int64_t i = 0; i < c.layers; ++i) {
    // Drawn in the same order either way, so both cuts start from the same parameters.
    auto block = std::make_shared<BlockUnit>(c);
    init_normal(block->attn->c_attn, std, gen);
    init_normal(block->attn->c_proj, proj_std, gen);
    init_normal(block->mlp->c_fc, std, gen);
    init_normal(block->mlp->c_proj, proj_std, gen);
    if (!sub_blocks) {
      model.units.push_back({c10::str("block", i), "TransformerBlock", block, {}});
      continue;
    }
    auto attn = std::make_shared<AttentionUnit>(c);
    auto mlp = std::make_shared<MlpUnit>(c);
    attn->ln_1 = attn->replace_module("ln_1", block->ln_1);
    attn->attn = attn->replace_module("attn", block->attn);
    mlp->ln_2 = mlp->replace_module("ln_2", block->ln_2);
    mlp->mlp = mlp->replace_module("mlp", block->mlp);
    model.units.push_back({c10::str("block", i, ".attn"), "Attention", attn, {}});
    model.units.push_back({c10::str("block", i, ".mlp"), "MLP", mlp, {}});
  }
  auto head = std::make_shared<GptHeadUnit>(c, c.tied ? embed : nullptr);
  std::vector<BorrowedParam> borrowed;
  if (c.tied) {
    borrowed.push_back({0, "wte.weight"});
  } else {
    init_normal(head->lm_head, std, gen);
  }
  model.units.push_back({"head", "Head", head, borrowed});
  model.task = std::make_unique<MarkovLanguage>(seed, c.vocab, c.seq);
  return model;
}

}  // namespace zeroplan::zoo::detail
