// The content of report.md and report.html.
#include "report_document.h"

#include <fmt/format.h>

#include "report_common.h"
#include "text.h"
#include "zeroplan/tuner/exports.h"

namespace zeroplan::tuner::report {
namespace {

Block heading(int level, std::string t) { return Block{Block::Kind::heading, level, std::move(t), {}, {}, {}}; }
Block para(std::string t) { return Block{Block::Kind::paragraph, 0, std::move(t), {}, {}, {}}; }
Block list(std::vector<std::string> items) { return Block{Block::Kind::list, 0, {}, std::move(items), {}, {}}; }
Block table(std::vector<std::string> header, std::vector<std::vector<std::string>> rows) {
  return Block{Block::Kind::table, 0, {}, {}, std::move(header), std::move(rows)};
}
Block plot(std::string which) { return Block{Block::Kind::plot, 0, std::move(which), {}, {}, {}}; }

std::string sps(double v) { return fmt::format("{:.2f}", v); }

// " (and 3 more plans differing in buckets, prefetch: the same prediction)", or "".
std::string equivalents_note(const RankedPlan& p) {
  if (p.equivalents == 0) return "";
  std::string knobs;
  for (const std::string& k : p.equivalent_knobs) knobs += (knobs.empty() ? "" : ", ") + k;
  return fmt::format(" (and {} more plan{} differing in {}: the same prediction)", p.equivalents,
                     p.equivalents == 1 ? "" : "s", knobs);
}

std::vector<std::string> plan_row(int rank, const RankedPlan& p) {
  const Prediction& q = p.prediction;
  return {std::to_string(rank), text::seconds(q.step_time_s), sps(q.samples_per_s), text::bytes(q.device.total_bytes()),
          text::bytes(q.host.total_bytes()), q.bound, summary(p.plan) + equivalents_note(p)};
}

// Global batch, ranks, memory limits, the knobs searched and fixed, how many plans were tried.
void setup_section(const TuneResult& r, std::vector<Block>& d) {
  std::vector<std::string> setup;
  setup.push_back(fmt::format("Global batch {}, {} ranks on {} of {} nodes ({} devices per node).", r.constraints.global_batch,
                              r.world_size, r.nodes_used, r.cluster.nodes, r.cluster.devices_per_node));
  setup.push_back(fmt::format("Memory per rank: device {} of {} (headroom {} and {:.0f}%), host {} of {}.",
                              text::bytes(r.limits.device_bytes), text::bytes(r.cluster.device.mem_bytes),
                              text::bytes(r.constraints.device_headroom_bytes), r.constraints.device_headroom_fraction * 100,
                              text::bytes(r.limits.host_bytes), text::bytes(r.cluster.host.mem_bytes)));
  std::vector<std::string> knobs;
  for (const auto& k : knob_names())
    if (r.constraints.varies(k)) knobs.push_back(k);
  setup.push_back("Knobs searched: " + (knobs.empty() ? std::string("none") : text::join(knobs)) + ".");
  if (!r.constraints.fixed.empty()) {
    std::vector<std::string> f;
    for (const auto& [k, v] : r.constraints.fixed) f.push_back(fmt::format("`{}={}`", k, v));
    setup.push_back("Fixed: " + text::join(f) + ".");
  }
  setup.push_back(fmt::format("Optimizer {}; approximate averaging (LocalSGD, SlowMo) {}.", r.constraints.optimizer,
                              r.constraints.allow_approximate_averaging ? "allowed" : "not allowed"));
  setup.push_back(fmt::format("{} candidates after {} invalid combinations; {} simulations; {} variants pruned by the memory "
                              "bound; {} candidates fit.",
                              r.candidates, r.rejections.invalid_total(), r.simulations, r.bound_prunes, r.fitting));
  d.push_back(list(setup));
  if (!r.notes.empty()) d.push_back(list(r.notes));
}

// The winner's figures: step time against its bound, peaks, communication, stages, busy resources.
void winner_section(const TuneResult& r, const RankedPlan& winner, std::vector<Block>& d) {
  const Prediction& q = winner.prediction;
  d.push_back(para(summary(winner.plan) + "."));
  std::vector<std::vector<std::string>> rows = {
      {"step time", text::seconds(q.step_time_s) +
                        (q.sync_step_time_s != q.step_time_s ? fmt::format(" (sync step {})", text::seconds(q.sync_step_time_s))
                                                             : std::string())},
      {"samples/s", sps(q.samples_per_s)},
      {"lower bound of the step", fmt::format("{} ({} above it)", text::seconds(q.lower_bound_s),
                                              text::percent(q.step_time_s / std::max(1e-300, q.lower_bound_s) - 1))},
      {"bound by", q.bound},
      {"device peak", fmt::format("{} of {} ({} allocator overhead)", text::bytes(q.device.total_bytes()),
                                  text::bytes(r.limits.device_bytes), text::bytes(q.device.allocator_overhead_bytes))},
      {"host peak", fmt::format("{} of {}", text::bytes(q.host.total_bytes()), text::bytes(r.limits.host_bytes))},
      {"exposed / overlapped communication",
       fmt::format("{} / {}", text::seconds(q.exposed_comm_s), text::seconds(q.overlapped_comm_s))},
  };
  if (!q.stages.empty()) {
    std::vector<std::string> peaks;
    for (const StagePrediction& st : q.stages) peaks.push_back(text::bytes(st.device.total_bytes()));
    rows.push_back({"pipeline bubble", fmt::format("{:.1f}% of the stages' time ({} stages, {} microbatches, {})",
                                                   100 * q.bubble_fraction, q.stages.size(), winner.plan.microbatches,
                                                   winner.plan.pipeline.schedule)});
    rows.push_back({"device peak per stage", text::join(peaks)});
  }
  for (const auto& [res, t] : resource_times(q)) rows.push_back({"busy: " + res, text::seconds(t)});
  d.push_back(table({"metric", "value"}, rows));
  const auto diff = knobs_vs_default(winner.plan, r);
  if (!diff.empty()) d.push_back(para("Differs from the default (DDP, no offload) in: " + text::join(diff) + "."));
}

// Why the winner beats the runner-up and the default, in the explanation's words.
void why_section(const TuneResult& r, std::vector<Block>& d) {
  d.push_back(heading(2, "Why this plan"));
  for (const PlanComparison& c : r.explanation.comparisons) {
    d.push_back(heading(3, c.against == "default" ? "Against the default" : "Against the runner-up"));
    std::vector<std::string> items;
    for (std::size_t i = 0; i < c.lines.size(); ++i) {
      const std::string& l = c.lines[i];
      if (l.rfind("- ", 0) == 0) items.push_back(l.substr(2));
      else {
        if (!items.empty()) {
          d.push_back(list(items));
          items.clear();
        }
        d.push_back(para(l));
      }
    }
    if (!items.empty()) d.push_back(list(items));
  }
  if (r.explanation.comparisons.empty()) d.push_back(para("No runner-up and no default to compare with."));
}

// Whether the default plan (DDP, no offload) fits, and by how much it misses when not.
void default_section(const TuneResult& r, std::vector<Block>& d) {
  d.push_back(heading(2, "Default plan (DDP, no offload)"));
  const DefaultCheck& def = r.default_plan;
  if (!def.valid) d.push_back(para("The default is not a valid plan here: " + def.invalid_reason));
  else if (!def.simulated) d.push_back(para("The default could not be simulated: " + def.error));
  else if (def.fits)
    d.push_back(para(fmt::format("The default fits: {} per step, {} samples/s, device peak {}.",
                                 text::seconds(def.prediction.step_time_s), sps(def.prediction.samples_per_s),
                                 text::bytes(def.device_needed_bytes))));
  else {
    std::vector<std::string> why;
    if (def.device_needed_bytes > def.device_available_bytes)
      why.push_back(fmt::format("device: needs {} ({} bytes) per rank, {} ({} bytes) available, {} over",
                                text::bytes(def.device_needed_bytes), def.device_needed_bytes, text::bytes(def.device_available_bytes),
                                def.device_available_bytes, text::bytes(def.device_needed_bytes - def.device_available_bytes)));
    if (def.host_needed_bytes > def.host_available_bytes)
      why.push_back(fmt::format("host: needs {} ({} bytes), {} ({} bytes) available, {} over", text::bytes(def.host_needed_bytes),
                                def.host_needed_bytes, text::bytes(def.host_available_bytes), def.host_available_bytes,
                                text::bytes(def.host_needed_bytes - def.host_available_bytes)));
    d.push_back(para("The default does not fit:"));
    d.push_back(list(why));
  }
}

// The ranking, the Pareto front and the winner's memory at its peak.
void ranking_section(const TuneResult& r, const RankedPlan& winner, std::vector<Block>& d) {
  d.push_back(heading(2, "Ranking"));
  std::vector<std::vector<std::string>> rows;
  for (std::size_t i = 0; i < r.ranking.size(); ++i) rows.push_back(plan_row(static_cast<int>(i + 1), r.ranking[i]));
  d.push_back(table({"#", "step time", "samples/s", "device peak", "host peak", "bound", "plan"}, rows));
  d.push_back(plot("breakdown"));

  d.push_back(heading(2, "Pareto front: device memory against throughput"));
  rows.clear();
  for (const RankedPlan& p : r.pareto)
    rows.push_back({text::bytes(p.prediction.device.total_bytes()), sps(p.prediction.samples_per_s),
                    text::seconds(p.prediction.step_time_s), summary(p.plan)});
  d.push_back(table({"device peak", "samples/s", "step time", "plan"}, rows));
  d.push_back(plot("pareto"));

  d.push_back(heading(2, "Memory at the winner's device peak"));
  rows.clear();
  for (const auto& [cat, bytes] : device_by_category(winner.prediction)) rows.push_back({cat, text::bytes(bytes)});
  d.push_back(table({"category", "bytes"}, rows));
  rows.clear();
  const auto& resident = winner.prediction.device.resident;
  for (std::size_t i = 0; i < std::min<std::size_t>(8, resident.size()); ++i)
    rows.push_back({resident[i].category, resident[i].name, text::bytes(resident[i].bytes)});
  if (!rows.empty()) d.push_back(table({"category", "largest items", "bytes"}, rows));
  d.push_back(plot("memory"));
}

// What was rejected and why, with the closest misses.
void rejected_section(const TuneResult& r, std::vector<Block>& d) {
  d.push_back(heading(2, "Rejected"));
  std::vector<std::string> rej;
  rej.push_back(fmt::format("{} invalid combinations, never simulated", r.rejections.invalid_total()));
  rej.push_back(fmt::format("{} out of memory by the analytic bound, never simulated", r.rejections.out_of_memory_bound));
  rej.push_back(fmt::format("{} out of memory when simulated", r.rejections.out_of_memory));
  if (r.rejections.errors) rej.push_back(fmt::format("{} the simulator refused", r.rejections.errors));
  if (r.rejections.dominated)
    rej.push_back(fmt::format("{} pipelines bounded out of the ranking (their step-time lower bound is above the ranked "
                              "plans' times), never simulated; the Pareto front holds the simulated plans",
                              r.rejections.dominated));
  d.push_back(list(rej));
  if (!r.rejections.invalid.empty()) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& [why, n] : r.rejections.invalid) rows.push_back({why, std::to_string(n)});
    d.push_back(table({"invalid because", "combinations"}, rows));
  }
  if (!r.rejections.error_messages.empty()) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& [why, n] : r.rejections.error_messages) rows.push_back({why, std::to_string(n)});
    d.push_back(table({"simulator error", "candidates"}, rows));
  }
  if (!r.rejections.closest.empty()) {
    std::vector<std::vector<std::string>> rows;
    for (const Rejection& x : r.rejections.closest)
      rows.push_back({std::string(x.status == Status::out_of_memory_bound ? "at least " : "") + text::bytes(x.device_excess_bytes),
                      text::bytes(x.host_excess_bytes), summary(x.plan)});
    d.push_back(para("Closest misses (bytes over the limit per rank):"));
    d.push_back(table({"device over", "host over", "plan"}, rows));
  }
}

// The exports of the winner: written, or what the tool cannot express.
void exports_section(const TuneResult& r, const RankedPlan& winner, std::vector<Block>& d) {
  d.push_back(heading(2, "Exports"));
  std::vector<std::vector<std::string>> rows;
  for (const Export& x : export_all(winner.plan, r.model, r.nodes_used, r.cluster.devices_per_node, r.cluster.device.kind)) {
    const std::string status = x.expressible() ? "written" : "cannot express: " + text::join(x.unsupported, "; ");
    rows.push_back({"`" + (x.expressible() ? x.file : x.file + ".unsupported.txt") + "`", x.tool, status, text::join(x.notes, "; ")});
  }
  d.push_back(table({"file", "tool", "status", "notes"}, rows));
}

}  // namespace

std::vector<Block> build_document(const TuneResult& r) {
  std::vector<Block> d;
  d.push_back(heading(1, fmt::format("zeroplan tune: {} on {}", r.model.name, r.cluster.name)));
  setup_section(r, d);
  const RankedPlan* best = r.best();
  d.push_back(heading(2, "Winner"));
  if (!best) {
    d.push_back(para("No plan fits under these constraints. The closest misses are listed under Rejected."));
  } else {
    winner_section(r, *best, d);
    why_section(r, d);
  }
  default_section(r, d);
  if (best) ranking_section(r, *best, d);
  rejected_section(r, d);
  if (best) exports_section(r, *best, d);
  return d;
}

}  // namespace zeroplan::tuner::report
