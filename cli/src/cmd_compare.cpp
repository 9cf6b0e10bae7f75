// zeroplan compare: a Prediction next to a RunRecord -> Comparison, and optionally both traces overlaid
// in one Chrome trace. The verdict is part of the output, not of the exit code: compare exits 0 when it
// could compare (pass or fail) and 1 on bad input, like every subcommand (cli.h).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "cli.h"
#include "zeroplan/config.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/sim/compare.h"
#include "zeroplan/sim/price.h"

namespace zeroplan::cli {
namespace {

namespace fs = std::filesystem;

struct CompareArgs {
  std::string predicted, measured, output, overlay, predicted_trace, measured_trace, model, baseline;
  double tolerance = 0.10;
  double memory_tolerance = 0.05;
  bool gate_phases = false;
};

// A path written into a document: as given (relative to where the producing command ran), else relative
// to the document's folder.
std::string resolve_near(const std::string& path, const std::string& document) {
  if (path.empty() || fs::path(path).is_absolute() || fs::exists(path)) return path;
  const fs::path near = fs::path(document).parent_path() / path;
  return fs::exists(near) ? near.string() : path;
}

std::string read_text(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ExitError(kBadInput, fmt::format("{}: cannot open {}", path, what));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool is_bytes(const std::string& name) { return name.find("_bytes") != std::string::npos; }

std::string value(const std::string& name, double v) {
  return is_bytes(name) ? fmt::format("{:.1f} MiB", v / double(1 << 20)) : fmt::format("{:.3f} ms", v * 1e3);
}

void print_table(const Comparison& c, const Prediction& p) {
  double memory_tol = 0;
  for (const Metric& m : c.metrics) memory_tol = std::max(memory_tol, m.tolerance);
  fmt::print(stderr, "comparison: {} on {}, {} ranks, zero_stage {}; tolerance {:.1f}% time, {:.1f}% memory\n",
             p.model, p.cluster, p.plan.world_size, p.plan.zero_stage, 100 * c.tolerance,
             100 * (memory_tol > 0 ? memory_tol : c.tolerance));
  fmt::print(stderr, "  {:<26} {:>14} {:>14} {:>10}  {}\n", "metric", "predicted", "measured", "rel. error",
             "within tolerance");
  for (const Metric& m : c.metrics) {
    const double tol = m.tolerance > 0 ? m.tolerance : c.tolerance;
    const char* within = !m.gating ? "- (not gating)" : std::fabs(m.rel_error) <= tol ? "yes" : "NO";
    fmt::print(stderr, "  {:<26} {:>14} {:>14} {:>+9.1f}%  {}\n", m.name, value(m.name, m.predicted),
               value(m.name, m.measured), 100 * m.rel_error, within);
  }
  if (!c.units.empty()) {
    fmt::print(stderr, "units (one microbatch; not gating):\n");
    for (const UnitComparison& u : c.units)
      for (const Metric& m : u.metrics)
        fmt::print(stderr, "  {:<26} {:>14} {:>14} {:>+9.1f}%\n", u.name + " " + m.name, value(m.name, m.predicted),
                   value(m.name, m.measured), 100 * m.rel_error);
  }
  if (!c.largest_error_sources.empty()) {
    fmt::print(stderr, "largest sources of error:\n");
    for (std::size_t i = 0; i < c.largest_error_sources.size(); ++i)
      fmt::print(stderr, "  {}. {}\n", i + 1, c.largest_error_sources[i]);
  }
  for (const std::string& w : c.warnings) fmt::print(stderr, "warning: {}\n", w);
  if (c.price) {
    const AveragingPrice& p = *c.price;
    fmt::print(stderr,
               "what the speed costs ({} against the synchronous run {}): loss {:.4f} against {:.4f} ({:+.1f}%) after {} "
               "steps (mean of the last {}), step {:.3f} s against {:.3f} s ({:.2f}x)\n",
               p.strategy, p.baseline, p.loss, p.baseline_loss, 100 * p.loss_change, p.steps, std::max(1, p.steps / 4),
               p.step_time_s, p.baseline_step_time_s, p.speedup);
  }
  fmt::print(stderr, "verdict: {}\n", c.verdict);
}

int run_compare(const CompareArgs& a, const Globals& g) {
  const auto prediction = read_document<Prediction>(a.predicted);
  const auto record = read_document<RunRecord>(a.measured);
  std::optional<ModelProfile> model;
  if (!a.model.empty()) model = read_document<ModelProfile>(a.model);

  sim::CompareOptions options;
  options.set_time_tolerance(a.tolerance)
      .set_memory_tolerance(a.memory_tolerance)
      .set_gate_phases(a.gate_phases)
      .set_model(model ? &*model : nullptr)
      .set_zeroplan_version(ZEROPLAN_VERSION);
  Comparison c = sim::compare(prediction, record, options);
  c.predicted = a.predicted;
  c.measured = a.measured;
  if (!a.baseline.empty()) c.price = sim::averaging_price(record, read_document<RunRecord>(a.baseline), a.baseline);

  if (!a.overlay.empty()) {
    std::string ptrace = a.predicted_trace, mtrace = a.measured_trace;
    if (ptrace.empty()) {
      if (prediction.trace_path.empty())
        throw ExitError(kBadInput, fmt::format("--trace-overlay: {} names no trace (simulate --trace); pass "
                                               "--predicted-trace",
                                               a.predicted));
      ptrace = resolve_near(prediction.trace_path, a.predicted);
    }
    if (mtrace.empty()) {
      if (record.trace_paths.empty())
        throw ExitError(kBadInput, fmt::format("--trace-overlay: {} names no trace (run --trace); pass "
                                               "--measured-trace",
                                               a.measured));
      mtrace = resolve_near(record.trace_paths[0], a.measured);
    }
    const std::string p_text = read_text(ptrace, "the predicted trace");
    const std::string m_text = read_text(mtrace, "the measured trace");
    std::string overlay;
    try {
      overlay = sim::overlay_traces(p_text, m_text);
    } catch (const SchemaError& e) {
      const std::string what = e.what();
      const bool measured_bad = what.rfind("measured", 0) == 0;
      throw ExitError(kBadInput, fmt::format("{}: {}", measured_bad ? mtrace : ptrace, what));
    }
    std::ofstream out(a.overlay, std::ios::binary);
    out << overlay;
    if (!out) throw ExitError(kBadInput, fmt::format("{}: cannot write the trace overlay", a.overlay));
  }
  if (!g.quiet) {
    print_table(c, prediction);
    if (!a.overlay.empty())
      fmt::print(stderr, "trace overlay: {} (pid 1 predicted, pid 2 measured; open in Perfetto)\n", a.overlay);
  }
  if (!a.output.empty()) write_document(a.output, c);
  if (g.json) fmt::print("{}", to_json_string(c));
  return kOk;
}

}  // namespace

Action add_compare(CLI::App& app, const Globals& globals) {
  auto a = std::make_shared<CompareArgs>();
  app.add_option("--predicted", a->predicted, "Prediction (from zeroplan simulate)")->required()->check(CLI::ExistingFile);
  app.add_option("--measured", a->measured, "RunRecord (from zeroplan run)")->required()->check(CLI::ExistingFile);
  app.add_option("-o,--output", a->output, "Write the Comparison here")->check(output_path());
  app.add_option("--tolerance", a->tolerance, "Largest relative error of step time that passes (exit code 0 whatever the verdict)")
      ->capture_default_str()
      ->check(positive());
  app.add_option("--memory-tolerance", a->memory_tolerance, "Largest relative error of a peak that passes")
      ->capture_default_str()
      ->check(positive());
  app.add_flag("--gate-phases", a->gate_phases, "Phases also decide the verdict (at --tolerance)");
  app.add_option("--model", a->model,
                 "ModelProfile the prediction came from: checks threads, profiled batches, versions")
      ->check(CLI::ExistingFile);
  app.add_option("--baseline", a->baseline,
                 "RunRecord of a synchronous (DDP) run of the same model, seed and batch: shows what a LocalSGD, "
                 "SlowMo or AdaScale run's speed costs in loss")
      ->check(CLI::ExistingFile);
  app.add_option("--trace-overlay", a->overlay,
                 "Write both traces into one Chrome trace (pid 1 predicted, pid 2 measured)");
  app.add_option("--predicted-trace", a->predicted_trace, "Predicted trace (default: the Prediction's trace_path)")
      ->check(CLI::ExistingFile);
  app.add_option("--measured-trace", a->measured_trace, "Measured trace (default: the RunRecord's first trace)")
      ->check(CLI::ExistingFile);
  return [a, &globals] { return run_compare(*a, globals); };
}

}  // namespace zeroplan::cli
