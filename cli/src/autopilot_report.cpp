// Autopilot's report as the tuner's report blocks: the setup, the plans run under the budget
// (predicted against measured, with verdicts), why the winner, the fidelity grid; report.md and a
// report.html with real tables and inline SVG figures.
#include <fmt/core.h>

#include <fstream>

#include "autopilot.h"

namespace zeroplan::cli::autopilot {
namespace {

using tuner::report::Block;
using tuner::report::PredictedMeasured;

constexpr double kMiBytes = 1 << 20;

std::optional<double> measured_peak(const Trial& t) {
  if (!t.record || t.record->peaks.empty()) return std::nullopt;
  return double(device_peak(*t.record).bytes);
}

Block trials_table(const std::vector<Trial>& trials) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& t : trials) {
    const double predicted_peak = double(t.prediction.device.total_bytes());
    if (t.ran) {
      const auto mp = measured_peak(t);
      const double et = relative_error(t.prediction.step_time_s, t.record->step_time_median_s);
      const double em = mp ? relative_error(predicted_peak, *mp) : 0;
      rows.push_back({t.label, describe(t.plan), fmt::format("{:.4f}", t.prediction.step_time_s),
                      fmt::format("{:.4f}", t.record->step_time_median_s), fmt::format("{:+.1f}%", 100 * et),
                      mib(predicted_peak), mp ? mib(*mp) : "", fmt::format("{:+.1f}%", 100 * em),
                      t.comparison ? t.comparison->verdict : ""});
    } else {
      rows.push_back({t.label, describe(t.plan), fmt::format("{:.4f}", t.prediction.step_time_s), "failed", "",
                      mib(predicted_peak), "", "", "run failed: " + t.failure});
    }
  }
  return Block::table({"plan", "knobs", "predicted step s", "measured step s", "error", "predicted peak",
                       "measured peak", "error", "verdict"},
                      std::move(rows));
}

// Step time (s) or peak device memory (MiB) of each trial, predicted and measured. The grid is judged
// on the simulator's device allocations (device.peak_bytes), the budgeted plans on the whole device
// need (total_bytes), as in their tables.
std::vector<PredictedMeasured> points(const std::vector<Trial>& trials, bool memory, bool allocations) {
  std::vector<PredictedMeasured> out;
  for (const Trial& t : trials) {
    PredictedMeasured p{t.label, describe(t.plan), t.prediction.step_time_s, std::nullopt};
    if (memory) {
      const auto bytes = allocations ? t.prediction.device.peak_bytes : t.prediction.device.total_bytes();
      p.predicted = double(bytes) / kMiBytes;
      if (auto m = measured_peak(t)) p.measured = *m / kMiBytes;
    } else if (t.record) {
      p.measured = t.record->step_time_median_s;
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::string plot(const ReportInput& in, const std::string& which) {
  namespace r = tuner::report;
  if (which == "time")
    return r::svg_predicted_measured_bars("Step time: predicted vs measured", "s", points(in.trials, false, false),
                                          std::nullopt);
  if (which == "memory")
    return r::svg_predicted_measured_bars("Peak device memory per rank: predicted vs measured", "MiB",
                                          points(in.trials, true, false), double(in.budget_bytes) / kMiBytes);
  if (which == "fidelity_time")
    return r::svg_predicted_measured_scatter("Fidelity grid: step time, measured against predicted", "s",
                                             points(in.grid, false, true), 0.10);
  if (which == "fidelity_memory")
    return r::svg_predicted_measured_scatter("Fidelity grid: peak device memory, measured against predicted", "MiB",
                                             points(in.grid, true, true), 0.05);
  return "";
}

std::vector<Block> document(const ReportInput& in) {
  std::vector<Block> d{Block::heading(1, "zeroplan autopilot report")};
  d.push_back(Block::paragraph(fmt::format(
      "Model: `{}` {} ({} parameters), {} ranks over {}, global batch {}; machine: `{}` ({} cores).", in.model,
      in.model_opts, in.params, in.nproc, in.gloo ? "Gloo on 127.0.0.1" : "one process", in.global_batch, in.cluster,
      in.cores)));
  d.push_back(Block::paragraph(fmt::format(
      "Device budget per rank: **{}** ({} bytes), enforced in the runs with `--device-memory-limit`; the tuner kept "
      "{:.0f}% of it free for what a prediction misses. The default plan (DDP, no offload) is predicted to need {}.",
      mib(double(in.budget_bytes)), in.budget_bytes, 100 * in.headroom, mib(double(in.default_need_bytes)))));
  d.push_back(Block::paragraph("Every prediction below is the simulator's (labelled *predicted*); every measured "
                               "figure comes from the run in this folder."));
  d.push_back(trials_table(in.trials));
  d.push_back(Block::plot("time"));
  d.push_back(Block::plot("memory"));
  d.push_back(Block::heading(2, "Why this plan"));
  d.push_back(Block::paragraph("The tuner's full report, with the ranking, the Pareto front and why the winner beats "
                               "the runner-up and the default: [tune/report.md](tune/report.md)."));
  for (const auto& t : in.trials) {
    if (!t.comparison) continue;
    d.push_back(Block::heading(3, fmt::format("{} — largest sources of error", t.label)));
    std::vector<std::string> items = t.comparison->largest_error_sources;
    for (const auto& w : t.comparison->warnings) items.push_back("warning: " + w);
    d.push_back(Block::list(std::move(items)));
  }
  if (in.price) {
    d.push_back(Block::heading(2, "What the speed costs"));
    if (const auto& p = in.price->price) {
      d.push_back(Block::paragraph(fmt::format(
          "The default plan and the same plan with {} (each rank its own node, so the ranks step apart and "
          "average their parameters), same seed and {} steps, no budget: the loss is the mean over the last {} "
          "step(s). Runs in `price/`.",
          p->strategy, p->steps, std::max(1, p->steps / 4))));
      d.push_back(Block::table({"run", "loss", "measured step s"},
                               {{"synchronous (DDP)", fmt::format("{:.4f}", p->baseline_loss), fmt::format("{:.4f}", p->baseline_step_time_s)},
                                {p->strategy, fmt::format("{:.4f}", p->loss), fmt::format("{:.4f}", p->step_time_s)},
                                {"change", percent(p->loss_change), fmt::format("{:.2f}x faster", p->speedup)}}));
    } else {
      d.push_back(Block::paragraph("No price: " + in.price->failure + "."));
    }
  }
  for (const Block& b : in.fidelity) d.push_back(b);
  d.push_back(Block::paragraph(fmt::format(
      "Files: `model_profile.json`, `cluster.json`, `tune/`, and per plan `plan.json`, `prediction.json`, "
      "`run_record.json`, `comparison.json`, traces (open in Perfetto; `overlay_trace.json` holds predicted and "
      "measured side by side), `run.log`. Autopilot took {:.0f} s.",
      in.elapsed_s)));
  return d;
}

}  // namespace

std::string write_report(const ReportInput& in, const fs::path& out) {
  const std::vector<Block> d = document(in);
  const std::string md = tuner::report::render_markdown(d);
  std::ofstream(out / "report.md") << md;
  std::ofstream(out / "report.html") << tuner::report::render_html(
      "zeroplan autopilot: " + in.model, d, [&in](const std::string& which) { return plot(in, which); });
  return md;
}

}  // namespace zeroplan::cli::autopilot
