// Analytic profiles from closed forms (see analytic.h), and the profile table of profiler.h. No torch.
#include "zeroplan/profiles/analytic.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <zeroplan/config.h>

#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/profiler.h"

namespace zeroplan {

int dtype_bytes(const std::string& dtype) {
  if (dtype == "fp32") return 4;
  if (dtype == "fp16" || dtype == "bf16") return 2;
  throw SchemaError(fmt::format("dtype \"{}\" is not one of fp32, fp16, bf16", dtype));
}

double gpt_layer_saved_bytes(std::int64_t seq, std::int64_t batch, std::int64_t hidden,
                             std::int64_t heads, int bytes_per_element) {
  const double s = static_cast<double>(seq), b = static_cast<double>(batch);
  const double h = static_cast<double>(hidden), a = static_cast<double>(heads);
  const double e = bytes_per_element;
  return s * b * h * (16 * e + 2) + a * s * s * b * (2 * e + 1);
}

double gpt_layer_saved_bytes_flash(std::int64_t seq, std::int64_t batch, std::int64_t hidden,
                                   std::int64_t heads, int bytes_per_element) {
  const double s = static_cast<double>(seq), b = static_cast<double>(batch);
  const double h = static_cast<double>(hidden), a = static_cast<double>(heads);
  return s * b * h * (16.0 * bytes_per_element + 2) + 4 * a * s * b;
}

UnitOp gemm_op(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, bool bias) {
  return {.kind = "gemm", .name = name, .m = m, .n = n, .k = k, .bias = bias};
}
UnitOp memory_op(const char* name, double elems_fwd, double bytes_fwd, int kernels_fwd, double elems_bwd,
                 double bytes_bwd, int kernels_bwd) {
  return {.kind = "memory", .name = name, .elems_fwd = elems_fwd, .elems_bwd = elems_bwd, .bytes_fwd = bytes_fwd,
          .bytes_bwd = bytes_bwd, .kernels_fwd = kernels_fwd, .kernels_bwd = kernels_bwd};
}

std::vector<UnitOp> gpt_block_ops(std::int64_t seq, std::int64_t batch, std::int64_t hidden, std::int64_t heads,
                                  bool flash_attention) {
  const std::int64_t T = seq * batch, h = hidden;
  const double Th = static_cast<double>(T) * static_cast<double>(h);
  // Flash attention applies dropout inside its kernel.
  const UnitOp attention{.kind = "attention", .name = "attention", .m = seq, .n = seq, .k = hidden / heads,
                         .batch = batch * heads, .fused = flash_attention, .causal = true, .dropout = !flash_attention};
  return {
      memory_op("layernorm1", 2 * Th, 0, 1, 3 * Th, 0, 2),
      gemm_op("qkv", T, 3 * h, h, true),
      attention,
      gemm_op("proj", T, h, h, true),
      memory_op("dropout1", 2 * Th, Th, 1, 2 * Th, Th, 1),
      memory_op("residual1", 3 * Th, 0, 1, 3 * Th, 0, 1),
      memory_op("layernorm2", 2 * Th, 0, 1, 3 * Th, 0, 2),
      gemm_op("fc1", T, 4 * h, h, true),
      memory_op("gelu", 8 * Th, 0, 1, 12 * Th, 0, 1),
      gemm_op("fc2", T, h, 4 * h, true),
      memory_op("dropout2", 2 * Th, Th, 1, 2 * Th, Th, 1),
      memory_op("residual2", 3 * Th, 0, 1, 3 * Th, 0, 1),
  };
}

std::int64_t gpt_layer_params(std::int64_t hidden) { return 12 * hidden * hidden + 13 * hidden; }

double gpt_layer_flops_fwd(std::int64_t seq, std::int64_t batch, std::int64_t hidden) {
  const double s = static_cast<double>(seq), b = static_cast<double>(batch);
  const double h = static_cast<double>(hidden);
  return 24 * b * s * h * h + 4 * b * s * s * h;
}

// Sub-block units: each layer as its attention half then its MLP half, one entry per layer each (the
// halves alternate, which a repeat count cannot say). Params, saved bytes, FLOPs and ops split as the
// block's: attention 4h^2 + 6h, saves its LayerNorm and QKV inputs, Q, K, V, the projection's input
// (6e bytes per token and channel) and a dropout mask, plus the scores (or flash's log-sum-exp); MLP
// 8h^2 + 7h, saves its LayerNorm and fc1 inputs, the GELU and fc2 inputs (4h each: 10e) and a mask.
std::vector<UnitProfile> sub_block_units(const AnalyticGptOptions& o, const UnitProfile& block, double e, double bd,
                                         double sd, double hd) {
  const auto prop = [&](double v) { return Figure::proportional(v, bd); };
  const std::int64_t h = o.hidden;
  std::vector<UnitProfile> blocks;
  const double sbh = sd * bd * hd, a = static_cast<double>(o.heads);
  const double scores = o.flash_attention ? 4 * a * sd * bd : a * sd * sd * bd * (2.0 * e + 1);
  for (std::int64_t l = 0; l < o.layers; ++l) {
    UnitProfile attn = block, mlp = block;
    attn.name = fmt::format("block{}.attn", l);
    attn.type = "Attention";
    attn.count = 1;
    attn.params = 4 * h * h + 6 * h;
    attn.bytes_saved = prop(sbh * (6.0 * e + 1) + scores);
    attn.flops_fwd = prop(8 * bd * sd * hd * hd + 4 * bd * sd * sd * hd);
    attn.flops_bwd = prop(2 * (8 * bd * sd * hd * hd + 4 * bd * sd * sd * hd));
    attn.ops.assign(block.ops.begin(), block.ops.begin() + 6);
    mlp.name = fmt::format("block{}.mlp", l);
    mlp.type = "MLP";
    mlp.count = 1;
    mlp.params = 8 * h * h + 7 * h;
    mlp.bytes_saved = prop(sbh * (10.0 * e + 1));
    mlp.flops_fwd = prop(16 * bd * sd * hd * hd);
    mlp.flops_bwd = prop(32 * bd * sd * hd * hd);
    mlp.ops.assign(block.ops.begin() + 6, block.ops.end());
    blocks.push_back(std::move(attn));
    blocks.push_back(std::move(mlp));
  }
  return blocks;
}

ModelProfile analytic_gpt(const AnalyticGptOptions& o) {
  const auto positive = [](const char* what, std::int64_t v) {
    if (v < 1) throw SchemaError(fmt::format("analytic gpt: {} must be >= 1 (got {})", what, v));
  };
  positive("layers", o.layers);
  positive("hidden", o.hidden);
  positive("heads", o.heads);
  positive("seq", o.seq);
  positive("vocab", o.vocab);
  positive("batch", o.batch);
  if (o.hidden % o.heads != 0) {
    throw SchemaError(fmt::format("analytic gpt: hidden {} is not a multiple of heads {}", o.hidden,
                                  o.heads));
  }
  const int e = dtype_bytes(o.dtype);
  const std::int64_t b = o.batch, s = o.seq, h = o.hidden, V = o.vocab;
  const double bd = static_cast<double>(b), sd = static_cast<double>(s);
  const double hd = static_cast<double>(h), vd = static_cast<double>(V);
  const auto prop = [&](double v) { return Figure::proportional(v, bd); };

  ModelProfile p;
  p.name = o.name;
  p.source = "analytic:gpt";
  p.measured = false;
  p.device = "analytic";
  p.dtype = o.dtype;
  p.threads = 1;
  p.library_versions = {{"zeroplan", ZEROPLAN_VERSION}};
  p.batch = o.batch;
  p.seq_len = s;
  p.input_shape = {b, s};

  UnitProfile embed;
  embed.name = "embed";
  embed.type = "Embedding";
  embed.params = V * h + s * h;
  embed.input_shape = {b, s};
  embed.output_shape = {b, s, h};
  embed.bytes_saved = prop(8 * bd * sd);
  embed.bytes_output = prop(e * bd * sd * hd);
  {
    const double Th = bd * sd * hd;
    // Token rows and position rows read, their sum written (2 kernels), then dropout; backward: the
    // rows scatter-added into the gradients (zeroing the dense V*h gradient, which does not grow with
    // the batch, is not counted).
    embed.ops = {memory_op("embedding", 3 * Th, 8 * bd * sd, 2, 3 * Th, 8 * bd * sd, 2),
                 memory_op("embed_dropout", 2 * Th, Th, 1, 2 * Th, Th, 1)};
  }

  UnitProfile block;
  block.name = "block";
  block.type = "TransformerBlock";
  block.count = static_cast<int>(o.layers);
  block.params = gpt_layer_params(h);
  block.input_shape = {b, s, h};
  block.output_shape = {b, s, h};
  block.bytes_saved = prop(o.flash_attention ? gpt_layer_saved_bytes_flash(s, b, h, o.heads, e)
                                             : gpt_layer_saved_bytes(s, b, h, o.heads, e));
  block.ops = gpt_block_ops(s, b, h, o.heads, o.flash_attention);
  block.bytes_output = prop(e * bd * sd * hd);
  block.flops_fwd = prop(gpt_layer_flops_fwd(s, b, h));
  block.flops_bwd = prop(2 * gpt_layer_flops_fwd(s, b, h));

  UnitProfile head;
  head.name = "head";
  head.type = "Head";
  head.params = 2 * h + (o.tied_embeddings ? 0 : V * h);
  head.input_shape = {b, s, h};
  head.output_shape = {b, s, V};
  // The head carries the task's loss (as the profiler measures the last unit): cross-entropy in fp32
  // (autocast's rule) keeps the log-softmax and builds its gradient, then the logits' gradient, in the
  // logits' dtype, waits for the head's backward (saved). Forward peak: the saved bytes, the logits,
  // and the two fp32 logits-sized temporaries of the loss.
  const double logits = e * bd * sd * vd, loss_fp32 = 4 * bd * sd * vd;
  head.bytes_saved = prop(2.0 * e * bd * sd * hd + logits);
  head.bytes_output = prop(logits);
  head.bytes_peak_fwd = prop(2.0 * e * bd * sd * hd + 2 * logits + 2 * loss_fp32);
  head.flops_fwd = prop(2 * bd * sd * hd * vd);
  head.flops_bwd = prop(4 * bd * sd * hd * vd);
  if (o.tied_embeddings) head.borrowed.push_back({0, V * h});  // the token embedding's weight
  {
    const double Th = bd * sd * hd, TV = bd * sd * vd;
    // The loss: logits cast to fp32 (read in dtype, 4 bytes written), log-softmax in fp32 (8 bytes);
    // backward: softmax minus one-hot in fp32 (8 bytes) and the cast back (4 bytes read, dtype written).
    head.ops = {memory_op("layernorm_f", 2 * Th, 0, 1, 3 * Th, 0, 2), gemm_op("logits", b * s, V, h, false),
                memory_op("loss", TV, 12 * TV, 3, TV, 12 * TV, 2)};
  }

  std::vector<UnitProfile> blocks;
  if (o.sub_blocks) blocks = sub_block_units(o, block, e, bd, sd, hd);
  else blocks.push_back(std::move(block));
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

std::optional<AnalyticGptOptions> analytic_gpt_options_of(const ModelProfile& p) {
  if (p.source != "analytic:gpt" || p.units.size() < 3) return std::nullopt;
  const UnitProfile& embed = p.units.front();
  const UnitProfile& head = p.units.back();
  if (embed.type != "Embedding" || head.type != "Head" || embed.output_shape.empty() || head.output_shape.empty())
    return std::nullopt;
  AnalyticGptOptions o;
  o.name = p.name;
  o.dtype = p.dtype;
  o.batch = p.batch;
  o.seq = p.seq_len;
  o.hidden = embed.output_shape.back();
  o.vocab = head.output_shape.back();
  o.tied_embeddings = !head.borrowed.empty();
  const UnitProfile& first = p.units[1];
  o.sub_blocks = first.type == "Attention";
  o.layers = o.sub_blocks ? static_cast<std::int64_t>(p.units.size() - 2) / 2 : first.count;
  const auto attention = std::find_if(first.ops.begin(), first.ops.end(), [](const UnitOp& op) { return op.kind == "attention"; });
  if (attention == first.ops.end() || p.batch < 1 || attention->batch % p.batch != 0) return std::nullopt;
  o.heads = attention->batch / p.batch;
  o.flash_attention = attention->fused;
  try {
    if (!(analytic_gpt(o) == p)) return std::nullopt;
  } catch (const SchemaError&) {
    return std::nullopt;
  }
  return o;
}

// ---- the profile table (declared in profiler.h; torch-free, so it lives here) ----

namespace {
std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (std::abs(bytes) >= 1024 && i < 4) {
    bytes /= 1024;
    ++i;
  }
  return i == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[i]);
}
std::string human_count(double n) {
  if (n >= 1e12) return fmt::format("{:.2f}T", n / 1e12);
  if (n >= 1e9) return fmt::format("{:.2f}G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.2f}K", n / 1e3);
  return fmt::format("{:.0f}", n);
}
std::string shape_str(const std::vector<std::int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }
std::string ms(double s) { return fmt::format("{:.3f}", s * 1e3); }
}  // namespace

void print_profile_table(const ModelProfile& p, std::FILE* out) {
  fmt::print(out, "{} ({}) on {}, {}, {} threads, batch {}{}\n", p.name, p.source, p.device, p.dtype,
             p.threads, p.batch, p.measured ? "" : " (analytic: times not measured)");
  const auto row = [&](const std::string& a, const std::string& b, const std::string& c,
                       const std::string& d, const std::string& e, const std::string& f,
                       const std::string& g, const std::string& h, const std::string& i,
                       const std::string& j, const std::string& k) {
    fmt::print(out, "{:<16} {:<18} {:>10} {:>12} {:>6} {:<18} {:<18} {:>12} {:>10} {:>10} {:>10}\n", a,
               b, c, d, e, f, g, h, i, j, k);
  };
  row("module name", "type", "param size", "activation", "#calls", "input shape", "output shape",
      "peak mem", "fwd ms", "bwd ms", "fwd GFLOP");
  double params = 0, bytes_param = 0, saved = 0, fwd = 0, bwd = 0, flops = 0, peak = 0;
  for (const auto& u : p.units) {
    row(u.name, u.type, human_count(static_cast<double>(u.params)), human_bytes(u.bytes_saved.value),
        std::to_string(u.count), shape_str(u.input_shape), shape_str(u.output_shape),
        human_bytes(u.bytes_peak_fwd.value), ms(u.time_fwd_s.value), ms(u.time_bwd_s.value),
        fmt::format("{:.3f}", u.flops_fwd.value / 1e9));
    params += static_cast<double>(u.params) * u.count;
    bytes_param += static_cast<double>(u.bytes_param) * u.count;
    saved += u.bytes_saved.value * u.count;
    fwd += u.time_fwd_s.value * u.count;
    bwd += u.time_bwd_s.value * u.count;
    flops += (u.flops_fwd.value + u.flops_bwd.value) * u.count;
    peak = std::max({peak, u.bytes_peak_fwd.value, u.bytes_peak_bwd.value});
  }
  fmt::print(out,
             "total: {} parameters ({}), activations saved {}, largest unit peak {}, forward {} ms, "
             "backward {} ms, {:.3f} GFLOP per step (fwd+bwd) at batch {}\n",
             human_count(params), human_bytes(bytes_param), human_bytes(saved), human_bytes(peak),
             ms(fwd), ms(bwd), flops / 1e9, p.batch);
  for (const auto& note : p.notes) fmt::print(out, "note: {}\n", note);
}

}  // namespace zeroplan
