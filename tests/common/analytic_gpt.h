// Analytic GPT profiles (`zeroplan profile --analytic gpt`) as the tests and benchmarks build them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "zeroplan/profiles/analytic.h"
#include "zeroplan/profiles/model_profile.h"

namespace zeroplan::fixtures {

// `layers` blocks of `hidden` with `heads` heads at sequence `seq`; the rest analytic_gpt's defaults
// (batch 1, tied embeddings, unfused attention), for the caller to change.
inline AnalyticGptOptions gpt_options(std::int64_t layers, std::int64_t hidden, std::int64_t heads, std::int64_t seq,
                                      std::int64_t vocab = 50257, std::string dtype = "fp16", std::string name = "gpt") {
  AnalyticGptOptions o;
  o.layers = layers;
  o.hidden = hidden;
  o.heads = heads;
  o.seq = seq;
  o.vocab = vocab;
  o.dtype = std::move(dtype);
  o.name = std::move(name);
  return o;
}

// GPT-3 175B: 96 layers, hidden 12288, 96 heads, sequence 2048, vocabulary 50257, fp16, batch 1.
inline AnalyticGptOptions gpt3_175b() { return gpt_options(96, 12288, 96, 2048, 50257, "fp16", "gpt3-175b"); }

// The embedding with the FLOPs of its gather and add, 2 x tokens x hidden per sample (proportional to
// the batch), where analytic_gpt() gives it neither FLOPs nor time: the figures the tuner's tests and
// benchmark were written against.
inline ModelProfile with_embedding_flops(ModelProfile m) {
  for (UnitProfile& u : m.units) {
    if (u.type != "Embedding" || u.flops_fwd.value > 0 || u.time_fwd_s.value > 0) continue;
    const double per_sample = 2.0 * static_cast<double>(m.seq_len) * static_cast<double>(u.output_shape.back());
    u.flops_fwd = Figure::proportional(per_sample * m.batch, m.batch);
    u.flops_bwd = Figure::proportional(per_sample * m.batch, m.batch);
  }
  return m;
}

}  // namespace zeroplan::fixtures
