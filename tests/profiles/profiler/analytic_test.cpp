#include "zeroplan/profiles/analytic.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "analytic_gpt.h"
#include "zeroplan/profiles/errors.h"

namespace zeroplan {
namespace {

using fixtures::gpt3_175b;

TEST(AnalyticGpt, Gpt3ParametersWithinHalfPercent) {
  ModelProfile p = analytic_gpt(gpt3_175b());
  const double params = static_cast<double>(p.total_params());
  EXPECT_LT(std::abs(params - 174.6e9) / 174.6e9, 0.005) << params;
  // Closed form: 96 (12h^2 + 13h) + V h + s h + 2h.
  const int64_t h = 12288;
  EXPECT_EQ(p.total_params(), 96 * (12 * h * h + 13 * h) + 50257 * h + 2048 * h + 2 * h);
  EXPECT_EQ(p.total_bytes_param(), 2 * p.total_params());
  EXPECT_EQ(p.expanded_unit_count(), 98);
  EXPECT_FALSE(p.measured);
}

TEST(AnalyticGpt, LayerActivationsEqualKorthikanti) {
  for (int batch : {1, 4}) {
    AnalyticGptOptions o = gpt3_175b();
    o.batch = batch;
    ModelProfile p = analytic_gpt(o);
    const UnitProfile& block = p.units.at(1);
    ASSERT_EQ(block.type, "TransformerBlock");
    EXPECT_EQ(block.count, 96);
    const double s = 2048, b = batch, h = 12288, a = 96;
    EXPECT_EQ(block.bytes_saved.value, s * b * h * (34 + 5 * a * s / h));
    EXPECT_EQ(block.bytes_saved.at(2 * b, b), 2 * block.bytes_saved.value);
    EXPECT_EQ(block.flops_fwd.value, 24 * b * s * h * h + 4 * b * s * s * h);
    EXPECT_EQ(block.flops_bwd.value, 2 * block.flops_fwd.value);
    EXPECT_EQ(block.time_fwd_s.value, 0);
  }
}

TEST(AnalyticGpt, Fp32WidensTensorsButNotMasks) {
  AnalyticGptOptions o = gpt3_175b();
  o.dtype = "fp32";
  ModelProfile p = analytic_gpt(o);
  const double s = 2048, h = 12288, a = 96;
  EXPECT_EQ(p.units.at(1).bytes_saved.value, s * h * (66 + 9 * a * s / h));
  EXPECT_EQ(p.total_bytes_param(), 4 * p.total_params());
}

TEST(AnalyticGpt, RoundTripsAndRejectsBadSizes) {
  ModelProfile p = analytic_gpt(gpt3_175b());
  nlohmann::json j = p;
  EXPECT_EQ(j.get<ModelProfile>(), p);
  AnalyticGptOptions o = gpt3_175b();
  o.heads = 7;
  try {
    analytic_gpt(o);
    FAIL();
  } catch (const SchemaError& e) {
    EXPECT_STREQ(e.what(), "analytic gpt: hidden 12288 is not a multiple of heads 7");
  }
  o = gpt3_175b();
  o.layers = 0;
  EXPECT_THROW(analytic_gpt(o), SchemaError);
  o = gpt3_175b();
  o.dtype = "int8";
  EXPECT_THROW(analytic_gpt(o), SchemaError);
}

TEST(AnalyticGpt, UntiedHeadAddsVocabTimesHidden) {
  AnalyticGptOptions o = gpt3_175b();
  const int64_t tied = analytic_gpt(o).total_params();
  o.tied_embeddings = false;
  EXPECT_EQ(analytic_gpt(o).total_params() - tied, 50257LL * 12288);
}


// --opt units=sub-block on the decoder families: each layer becomes "block<l>.attn" then
// "block<l>.mlp", whose parameters, saved bytes, FLOPs and ops are exactly the whole layer's.
TEST(AnalyticDecoder, SubBlocksSplitEachLayerExactly) {
  for (const char* family : {"llama", "mpt"}) {
    for (const bool flash : {false, true}) {
      AnalyticDecoderOptions o;
      o.family = family;
      o.layers = 3;
      o.hidden = 256;
      o.heads = 8;
      o.kv_heads = std::string(family) == "llama" ? 2 : 0;
      o.intermediate = 688;
      o.seq = 128;
      o.vocab = 1000;
      o.batch = 2;
      o.flash_attention = flash;
      o.qkv_bias = std::string(family) == "llama";
      o.biases = std::string(family) == "mpt";
      o.learned_positions = std::string(family) == "mpt" && flash ? 128 : 0;
      const ModelProfile whole = analytic_decoder(o);
      o.sub_blocks = true;
      const ModelProfile split = analytic_decoder(o);
      ASSERT_EQ(whole.units.size(), 3u) << family;
      ASSERT_EQ(split.units.size(), 2u + 2 * 3) << family;
      const UnitProfile& layer = whole.units[1];
      for (int l = 0; l < 3; ++l) {
        const UnitProfile& attn = split.units[1 + 2 * l];
        const UnitProfile& mlp = split.units[2 + 2 * l];
        EXPECT_EQ(attn.name, "block" + std::to_string(l) + ".attn");
        EXPECT_EQ(mlp.name, "block" + std::to_string(l) + ".mlp");
        EXPECT_EQ(attn.params + mlp.params, layer.params) << family;
        EXPECT_GT(attn.params, 0);
        EXPECT_GT(mlp.params, 0);
        EXPECT_DOUBLE_EQ(attn.bytes_saved.at(2, 2) + mlp.bytes_saved.at(2, 2), layer.bytes_saved.at(2, 2)) << family;
        EXPECT_DOUBLE_EQ(attn.flops_fwd.at(2, 2) + mlp.flops_fwd.at(2, 2), layer.flops_fwd.at(2, 2)) << family;
        EXPECT_DOUBLE_EQ(attn.flops_bwd.at(2, 2) + mlp.flops_bwd.at(2, 2), layer.flops_bwd.at(2, 2)) << family;
        std::vector<UnitOp> ops = attn.ops;
        ops.insert(ops.end(), mlp.ops.begin(), mlp.ops.end());
        EXPECT_EQ(ops, layer.ops) << family;
        EXPECT_TRUE(std::any_of(attn.ops.begin(), attn.ops.end(), [](const UnitOp& op) { return op.kind == "attention"; }));
        EXPECT_EQ(mlp.ops.back().name, "residual2");
      }
      std::int64_t total_whole = 0, total_split = 0;
      for (const UnitProfile& u : whole.units) total_whole += u.params * u.count;
      for (const UnitProfile& u : split.units) total_split += u.params * u.count;
      EXPECT_EQ(total_split, total_whole) << family;
    }
  }
}

// llm-foundry's MPT (biases on every norm and linear, learned positions of max_seq_len rows): MPT-7B at
// sequence 2048 has the 6,658,859,008 parameters its benchmark table lists.
TEST(AnalyticDecoder, MptWithBiasesAndLearnedPositionsCountsLlmFoundrysModel) {
  AnalyticDecoderOptions o;
  o.family = "mpt";
  o.layers = 32;
  o.hidden = 4096;
  o.heads = 32;
  o.intermediate = 4 * 4096;
  o.vocab = 50368;
  o.seq = 2048;
  o.biases = true;
  o.learned_positions = 2048;
  std::int64_t total = 0;
  for (const UnitProfile& u : analytic_decoder(o).units) total += u.params * u.count;
  EXPECT_EQ(total, 6658859008);
  o.family = "llama";
  EXPECT_THROW(analytic_decoder(o), SchemaError);  // biases and learned positions are mpt's
}

}  // namespace
}  // namespace zeroplan
