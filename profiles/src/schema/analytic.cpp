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

std::int64_t gpt_layer_params(std::int64_t hidden) { return 12 * hidden * hidden + 13 * hidden; }

double gpt_layer_flops_fwd(std::int64_t seq, std::int64_t batch, std::int64_t hidden) {
  const double s = static_cast<double>(seq), b = static_cast<double>(batch);
  const double h = static_cast<double>(hidden);
  return 24 * b * s * h * h + 4 * b * s * s * h;
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

  UnitProfile block;
  block.name = "block";
  block.type = "TransformerBlock";
  block.count = static_cast<int>(o.layers);
  block.params = gpt_layer_params(h);
  block.input_shape = {b, s, h};
  block.output_shape = {b, s, h};
  block.bytes_saved = prop(gpt_layer_saved_bytes(s, b, h, o.heads, e));
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

  for (UnitProfile* u : {&embed, &block, &head}) {
    u->bytes_param = u->params * e;
    p.units.push_back(std::move(*u));
  }
  validate(p);
  return p;
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
