// zeroplan calibrate: fit a cluster file's time-model terms to measured runs -> a calibrated ClusterProfile.
// Two sources of measured runs: a public table (--table, llm-foundry's MPT benchmarks as shipped in
// profiles/data/calibration/) or the user's own RunRecords (--runs, with the --model profile they ran).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/sim/calibrate.h"
#include "zeroplan/sim/errors.h"
#include "zeroplan/sim/fidelity.h"

namespace zeroplan::cli {
namespace {

struct CalibrateArgs {
  std::string cluster, table, device, model, output, rows_output;
  std::vector<std::string> runs, terms;
  std::string hold_out = "every-other";
  int threads = 0;
  int max_evaluations = 600;
};

std::string pct(double v) { return fmt::format("{:.1f}%", 100 * v); }

// The provenance of each fitted term: what it was fitted to, and how well the fit does where it was not fitted.
std::string citation(const std::string& source, const sim::CalibrationResult& r) {
  return fmt::format("fitted by `zeroplan calibrate` to {}: {} rows fitted (median step-time error {} before, {} after), "
                     "{} held out (median {} before, {} after, worst {}); terms fitted together: {}",
                     source, r.fitted_after.rows, pct(r.fitted_before.median), pct(r.fitted_after.median),
                     r.held_out_after.rows, pct(r.held_out_before.median), pct(r.held_out_after.median),
                     pct(r.held_out_after.worst), fmt::join(r.terms, ", "));
}

std::vector<sim::CalibrationRow> rows_from_table(const CalibrateArgs& a, std::string& cluster_name, std::string& source) {
  std::ifstream in(a.table);
  if (!in) throw ExitError(kBadInput, fmt::format("--table {}: cannot open", a.table));
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw ExitError(kBadInput, fmt::format("--table {}: not JSON (byte {})", a.table, e.byte));
  }
  if (a.device.empty()) throw ExitError(kBadInput, "--table needs --device (h100_80gb, a100_80gb, a100_40gb)");
  if (cluster_name.empty()) cluster_name = sim::cluster_for_benchmark_device(a.device);
  if (cluster_name.empty())
    throw ExitError(kBadInput, fmt::format("--device {}: no shipped cluster for it (h100_80gb, a100_80gb, a100_40gb); "
                                           "name one with --cluster", a.device));
  std::vector<sim::CalibrationRow> rows = sim::benchmark_rows(doc, a.device, cluster_name);
  source = fmt::format("{} rows on {} of {} ({}, commit {}; model sizes 125m, 760m, 3b, 13b, 70b fitted, 350m, 1b, 7b, "
                       "30b held out)",
                       rows.size(), a.device, doc.value("source", a.table), doc.value("url", ""),
                       doc.value("commit", "").substr(0, 12));
  return rows;
}

std::vector<sim::CalibrationRow> rows_from_runs(const CalibrateArgs& a, const ClusterProfile& cluster, std::string& source) {
  if (a.model.empty()) throw ExitError(kBadInput, "--runs needs --model, the ModelProfile the runs trained");
  const ModelProfile model = read_document<ModelProfile>(a.model);
  std::vector<sim::CalibrationRow> rows;
  for (std::size_t i = 0; i < a.runs.size(); ++i) {
    const RunRecord rec = read_document<RunRecord>(a.runs[i]);
    if (rec.model != model.name)
      throw ExitError(kBadInput, fmt::format("--runs {}: trained model \"{}\", --model {} is \"{}\"", a.runs[i], rec.model,
                                             a.model, model.name));
    sim::CalibrationRow row;
    row.label = a.runs[i];
    row.model = model;
    row.plan = rec.plan;
    const int per_node = std::max(1, cluster.devices_per_node);
    row.cluster = cluster;
    row.cluster.nodes = std::max(1, (rec.plan.world_size + per_node - 1) / per_node);
    row.measured_step_s = rec.step_time_median_s;
    row.held_out = a.hold_out == "every-other" && a.runs.size() > 1 && i % 2 == 1;
    rows.push_back(std::move(row));
  }
  source = fmt::format("{} RunRecords of {} ({}{})", a.runs.size(), model.name, fmt::join(a.runs, ", "),
                       a.hold_out == "every-other" && a.runs.size() > 1 ? "; every other one held out" : "");
  return rows;
}

void print_result(const sim::CalibrationResult& r, const Calibration& start) {
  fmt::print(stderr, "calibrated {} terms in {} evaluations:\n", r.terms.size(), r.evaluations);
  for (const std::string& t : r.terms)
    fmt::print(stderr, "  {:<28} {:>12.6g}  (was {:.6g})\n", t, sim::calibration_term(r.calibration, t),
               sim::calibration_term(start, t));
  fmt::print(stderr, "  step-time error, fitted rows   ({:>3}): median {:>6} -> {:>6}, worst {:>6} -> {:>6}\n",
             r.fitted_after.rows, pct(r.fitted_before.median), pct(r.fitted_after.median), pct(r.fitted_before.worst),
             pct(r.fitted_after.worst));
  if (r.held_out_after.rows > 0)
    fmt::print(stderr, "  step-time error, held-out rows ({:>3}): median {:>6} -> {:>6}, worst {:>6} -> {:>6} ({})\n",
               r.held_out_after.rows, pct(r.held_out_before.median), pct(r.held_out_after.median),
               pct(r.held_out_before.worst), pct(r.held_out_after.worst), r.held_out_after.worst_label);
}

// One line per row: measured and predicted tokens/s per GPU (or step times), before and after.
std::string rows_markdown(const sim::CalibrationResult& r) {
  std::ostringstream o;
  o << "| row | held out | measured | predicted before | predicted after | error after |\n|---|---|---|---|---|---|\n";
  for (const sim::CalibratedRow& x : r.rows) {
    auto v = [&](double s) {
      return x.tokens_per_gpu_step > 0 ? fmt::format("{:.0f} tok/s/GPU", x.tokens_per_gpu_step / s)
                                       : fmt::format("{:.4f} s", s);
    };
    o << fmt::format("| {} | {} | {} | {} | {} | {:+.1f}% |\n", x.label, x.held_out ? "yes" : "", v(x.measured_s),
                     v(x.before_s), v(x.after_s), 100 * (x.after_s - x.measured_s) / x.measured_s);
  }
  return o.str();
}

int run_calibrate(const CalibrateArgs& a, const Globals& g) {
  if (a.table.empty() == a.runs.empty())
    throw ExitError(kBadInput, "give exactly one of --table (a public table) and --runs (RunRecords)");
  std::string cluster_name = a.cluster, source;
  std::vector<sim::CalibrationRow> rows;
  ClusterProfile base;
  if (!a.table.empty()) {
    rows = rows_from_table(a, cluster_name, source);
    base = resolve_cluster(cluster_name);
  } else {
    if (a.cluster.empty()) throw ExitError(kBadInput, "--runs needs --cluster, the cluster file the runs ran on");
    base = resolve_cluster(a.cluster);
    rows = rows_from_runs(a, base, source);
  }
  sim::CalibrationOptions options;
  options.terms = a.terms;
  options.threads = a.threads > 0 ? a.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  options.max_evaluations = a.max_evaluations;
  const sim::CalibrationResult r = sim::calibrate(rows, base.calibration, options);
  if (!g.quiet) print_result(r, base.calibration);
  ClusterProfile out = base;
  out.calibration = r.calibration;
  // The fitted terms' provenance replaces what covered them; a term left at its neutral value is not written.
  out.provenance.erase("calibration");
  const std::string cite = citation(source, r);
  for (const std::string& t : sim::calibration_term_names()) {
    out.provenance.erase("calibration." + t);
    if (sim::calibration_term(out.calibration, t) == sim::calibration_term(Calibration{}, t)) continue;
    const bool fitted = std::find(r.terms.begin(), r.terms.end(), t) != r.terms.end();
    out.provenance["calibration." + t] = fitted ? Provenance{"calibration", cite}
                                                : base.provenance.count("calibration." + t)
                                                      ? base.provenance.at("calibration." + t)
                                                      : Provenance{"calibration", "kept from " + base.name};
  }
  if (!a.output.empty()) {
    write_document(a.output, out);
    if (!g.quiet) fmt::print(stderr, "wrote {}\n", a.output);
  }
  if (!a.rows_output.empty()) {
    std::ofstream f(a.rows_output);
    f << rows_markdown(r);
    if (!f) throw ExitError(kBadInput, fmt::format("--rows {}: cannot write", a.rows_output));
  }
  if (g.json) fmt::print("{}", to_json_string(out));
  return kOk;
}

}  // namespace

Action add_calibrate(CLI::App& app, const Globals& globals) {
  auto a = std::make_shared<CalibrateArgs>();
  app.add_option("--cluster", a->cluster,
                 "Cluster file to calibrate (shipped name or path); with --table, default the device's shipped file");
  app.add_option("--table", a->table, "Calibration rows from a public table (profiles/data/calibration/llm-foundry-mpt.json)")
      ->check(CLI::ExistingFile);
  app.add_option("--device", a->device, "With --table: the table's device to fit (h100_80gb, a100_80gb, a100_40gb)");
  app.add_option("--runs", a->runs, "RunRecords (zeroplan run -o) measured on --cluster")->check(CLI::ExistingFile);
  app.add_option("--model", a->model, "With --runs: the ModelProfile the runs trained")->check(model_profile_file());
  app.add_option("--hold-out", a->hold_out, "With --runs: every-other (judge the fit on every second run) or none")
      ->check(CLI::IsMember({"every-other", "none"}));
  app.add_option("--terms", a->terms, fmt::format("Terms to fit (default: by the rows); known: {}",
                                                  fmt::join(sim::calibration_term_names(), ", ")))
      ->delimiter(',')
      ->check(CLI::IsMember(sim::calibration_term_names()));
  app.add_option("--threads", a->threads, "Rows simulated at once (0: every core)")->check(threads_option());
  app.add_option("--max-evaluations", a->max_evaluations, "Most objective evaluations of the search")
      ->check(number_in(1, 100000));
  app.add_option("-o,--output", a->output, "Write the calibrated ClusterProfile")->check(output_path());
  app.add_option("--rows", a->rows_output, "Write a markdown table of every row, measured and predicted")->check(output_path());
  return [a, &globals] { return run_calibrate(*a, globals); };
}

}  // namespace zeroplan::cli
