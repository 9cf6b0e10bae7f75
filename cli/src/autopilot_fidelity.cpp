// Autopilot's fidelity grid in the report and fidelity.json: per plan predicted against measured step
// time and peak memory, the summary against the targets, and calibration judged on unseen plans.
#include <fmt/core.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "autopilot.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/sim/fidelity.h"
#include "zeroplan/sim/simulate.h"

namespace zeroplan::cli::autopilot {
namespace {

using tuner::report::Block;

Block summary_list(const sim::FidelitySummary& f) {
  auto met = [](bool ok) { return ok ? "met" : "**missed**"; };
  return Block::list({
      fmt::format("{} plans. Step time: median |error| {}, maximum {} ({}); target median under 10%: {}.", f.plans,
                  percent(f.time.median_abs_error), percent(f.time.max_abs_error), f.time.max_label,
                  met(f.time.median_abs_error < 0.10)),
      fmt::format("Peak device memory: median |error| {}, maximum {} ({}); target median under 5%: {}.",
                  percent(f.memory.median_abs_error), percent(f.memory.max_abs_error), f.memory.max_label,
                  met(f.memory.median_abs_error < 0.05)),
      fmt::format("Ranking of the plans, measured vs predicted (Spearman): step time {:.3f}, peak memory {:.3f}; "
                  "target above 0.9: {}.",
                  f.time_spearman, f.memory_spearman, met(f.time_spearman > 0.9)),
  });
}

nlohmann::json summary_json(const sim::FidelitySummary& f) {
  auto num = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  return {{"plans", f.plans},
          {"time_median_abs_error", f.time.median_abs_error}, {"time_max_abs_error", f.time.max_abs_error},
          {"time_max_plan", f.time.max_label},
          {"memory_median_abs_error", f.memory.median_abs_error}, {"memory_max_abs_error", f.memory.max_abs_error},
          {"memory_max_plan", f.memory.max_label},
          {"time_spearman", num(f.time_spearman)}, {"memory_spearman", num(f.memory_spearman)}};
}

// measured / predicted of a comparison's metric, when both are positive.
std::optional<double> metric_ratio(const Trial& t, const std::string& name) {
  if (!t.comparison) return std::nullopt;
  for (const Metric& m : t.comparison->metrics)
    if (m.name == name && m.predicted > 0 && m.measured > 0) return m.measured / m.predicted;
  return std::nullopt;
}

// Calibration, judged fairly: fit ClusterProfile factors (the median measured / predicted compute and
// collective time) on the odd-numbered grid plans, re-simulate the even-numbered ones with them, and
// judge those only.
std::vector<Block> calibration_section(const std::vector<Trial>& grid, const CalibrationInput& in, nlohmann::json& j) {
  std::vector<double> compute, comm;
  std::string fitted_on, judged_on;
  for (std::size_t i = 0; i < grid.size(); i += 2) {
    if (!grid[i].ran) continue;
    if (auto r = metric_ratio(grid[i], "phase.compute_s")) compute.push_back(*r);
    if (auto r = metric_ratio(grid[i], "phase.comm_s")) comm.push_back(*r);
    fitted_on += (fitted_on.empty() ? "" : ", ") + grid[i].label;
  }
  std::vector<Block> d{Block::heading(3, "Calibrated")};
  if (compute.empty()) {
    d.push_back(Block::paragraph("No calibration plan ran, so nothing was fitted."));
    return d;
  }
  ClusterProfile cal = in.cluster;
  // The predictions already carry the cluster's factors (e.g. the probe's compute slowdown): refine them.
  cal.calibration.compute_time_scale = in.cluster.calibration.compute_time_scale * sim::median(compute);
  cal.calibration.comm_time_scale = in.cluster.calibration.comm_time_scale * (comm.empty() ? 1.0 : sim::median(comm));
  cal.provenance.erase("calibration.compute_time_scale");
  cal.provenance.erase("calibration.comm_time_scale");
  cal.provenance["calibration"] =
      Provenance{"calibration", fmt::format("zeroplan autopilot --calibrate: median measured / predicted compute and "
                                            "collective time over plans {}", fitted_on)};
  write_document(in.out / "cluster_calibrated.json", cal);
  std::vector<sim::FidelityRow> rows;
  for (std::size_t i = 1; i < grid.size(); i += 2) {
    const Trial& t = grid[i];
    if (!t.ran) continue;
    const std::int64_t peak = device_peak(*t.record).bytes;
    const Prediction pred = sim::simulate(in.profile, cal, t.plan);
    rows.push_back({t.label, pred.step_time_s, t.record->step_time_median_s, double(pred.device.peak_bytes), double(peak)});
    judged_on += (judged_on.empty() ? "" : ", ") + t.label;
  }
  d.push_back(Block::paragraph(fmt::format(
      "Fitted on {} (compute time x{:.3f}, collective time x{:.3f}: `cluster_calibrated.json`), then judged on the "
      "other plans only ({}), whose predictions were made again with those factors:",
      fitted_on, cal.calibration.compute_time_scale, cal.calibration.comm_time_scale, judged_on)));
  std::vector<std::vector<std::string>> table;
  for (const auto& r : rows)
    table.push_back({r.label, fmt::format("{:.4f}", r.predicted_time_s), fmt::format("{:.4f}", r.measured_time_s),
                     fmt::format("{:+.1f}%", 100 * relative_error(r.predicted_time_s, r.measured_time_s))});
  d.push_back(Block::table({"plan", "calibrated predicted step s", "measured step s", "error"}, std::move(table)));
  j["calibration"] = {{"compute_time_scale", cal.calibration.compute_time_scale},
                      {"comm_time_scale", cal.calibration.comm_time_scale},
                      {"fitted_on", fitted_on}, {"judged_on", judged_on}};
  if (!rows.empty()) {
    const sim::FidelitySummary f = sim::summarize_fidelity(rows);
    d.push_back(summary_list(f));
    j["calibration"]["summary"] = summary_json(f);
  }
  return d;
}

}  // namespace

std::vector<Block> fidelity_section(const std::vector<Trial>& grid, const fs::path& out,
                                    const std::optional<CalibrationInput>& calibration) {
  std::vector<sim::FidelityRow> rows;
  nlohmann::json j = {{"schema", "zeroplan.fidelity/1"}, {"rows", nlohmann::json::array()}};
  std::vector<Block> d{Block::heading(2, "Fidelity over the grid")};
  d.push_back(Block::paragraph(
      "Each plan ran without a memory limit. Predicted peak: the simulator's device allocations "
      "(`device.peak_bytes`); measured: the largest device peak over the ranks (counting allocator). "
      "Errors are (predicted - measured) / measured."));
  d.push_back(Block::plot("fidelity_time"));
  d.push_back(Block::plot("fidelity_memory"));
  std::vector<std::vector<std::string>> table;
  for (const Trial& t : grid) {
    if (!t.ran) {
      table.push_back({t.label, describe(t.plan), fmt::format("{:.4f}", t.prediction.step_time_s), "failed", "",
                       mib(double(t.prediction.device.peak_bytes)), "", "", "", t.failure});
      continue;
    }
    const DevicePeak peak = device_peak(*t.record);
    sim::FidelityRow row{t.label, t.prediction.step_time_s, t.record->step_time_median_s,
                         double(t.prediction.device.peak_bytes), double(peak.bytes)};
    rows.push_back(row);
    j["rows"].push_back({{"label", row.label}, {"predicted_time_s", row.predicted_time_s},
                         {"measured_time_s", row.measured_time_s}, {"predicted_peak_bytes", row.predicted_peak_bytes},
                         {"measured_peak_bytes", row.measured_peak_bytes}});
    if (!t.round_steps.empty()) j["rows"].back()["measured_time_rounds_s"] = t.round_steps;
    const std::string source = t.comparison && !t.comparison->largest_error_sources.empty()
                                   ? t.comparison->largest_error_sources.front() : "";
    std::string measured = fmt::format("{:.4f}", row.measured_time_s);
    if (t.round_steps.size() > 1) {
      measured += fmt::format(" (rounds {:.4f}-{:.4f})", t.round_steps.front(), t.round_steps.back());
    }
    table.push_back({t.label, describe(t.plan), fmt::format("{:.4f}", row.predicted_time_s), measured,
                     fmt::format("{:+.1f}%", 100 * relative_error(row.predicted_time_s, row.measured_time_s)),
                     mib(row.predicted_peak_bytes), mib(row.measured_peak_bytes),
                     fmt::format("{:+.1f}%", 100 * relative_error(row.predicted_peak_bytes, row.measured_peak_bytes)),
                     peak.at, source});
  }
  d.push_back(Block::table({"plan", "knobs", "predicted step s", "measured step s", "error", "predicted peak",
                            "measured peak", "error", "measured peak in", "largest source of error"},
                           std::move(table)));
  if (rows.empty()) {
    d.push_back(Block::paragraph("No grid plan ran, so there is no summary."));
  } else {
    const sim::FidelitySummary f = sim::summarize_fidelity(rows);
    d.push_back(summary_list(f));
    j["summary"] = summary_json(f);
  }
  if (calibration) {
    for (Block& b : calibration_section(grid, *calibration, j)) d.push_back(std::move(b));
  }
  std::ofstream(out / "fidelity.json") << j.dump(2) << "\n";
  return d;
}

}  // namespace zeroplan::cli::autopilot
