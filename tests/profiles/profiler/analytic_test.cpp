#include "zeroplan/profiles/analytic.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

}  // namespace
}  // namespace zeroplan
