// zeroplan tune: search every strategy knob for the fastest plan that fits, explain the choice, write
// the reports and the exports (DeepSpeed, Accelerate FSDP, fairscale).
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <memory>

#include "cli.h"
#include "zeroplan/sim/calibrate.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/tuner/constraints.h"
#include "zeroplan/tuner/granularity.h"
#include "zeroplan/tuner/max_model.h"
#include "zeroplan/tuner/report.h"
#include "zeroplan/tuner/tune.h"

namespace zeroplan::cli {
namespace {

struct TuneArgs {
  std::string model, cluster, output_dir, max_model;
  std::int64_t seq = 2048;
  tuner::TuneConstraints constraints;
  std::string knobs;
  std::vector<std::string> fixes;
  double device_memory_gib = 0;
  int top_k = 10;
  int threads = 0;
  bool compare_granularity = false;
};

void print_ranking(const tuner::TuneResult& r) {
  fmt::print(stderr, "tune: {} on {} x {} ({} ranks), global batch {}: {} candidates, {} simulated, {} fit\n",
             r.model.name, r.nodes_used, r.cluster.name, r.world_size, r.constraints.global_batch, r.candidates,
             r.simulations, r.fitting);
  fmt::print(stderr, "  {:>2}  {:>11}  {:>10}  {:>12}  {:>12}  {:<14} {}\n", "#", "step s", "samples/s",
             "device peak", "host peak", "bound", "plan");
  int i = 0;
  for (const auto& rp : r.ranking) {
    const auto& p = rp.prediction;
    const auto& plan = rp.plan;
    std::string knobs = fmt::format("stage {}{}{}{}{} mb {}x{}", plan.zero_stage,
                                    plan.offload.params ? " +off.params" : "", plan.offload.grads ? " +off.grads" : "",
                                    plan.offload.optimizer ? " +off.optim" : "",
                                    plan.offload.activations_ratio > 0 ? fmt::format(" +off.act {:.2f}", plan.offload.activations_ratio) : "",
                                    plan.micro_batch, plan.microbatches);
    // Every knob two ranked plans may differ in, so no two rows read alike: dtype, 16-bit broadcasts,
    // resharding, checkpointing, pipeline stages, OffloadModel.
    knobs += " " + precision_name(plan.precision);
    if (plan.zero_stage == 3 && !plan.reshard_after_forward) knobs += " no-reshard";
    if (plan.checkpointing.mode == Checkpointing::Mode::all) knobs += " ckpt all";
    if (plan.checkpointing.mode == Checkpointing::Mode::units)
      knobs += fmt::format(" ckpt {} units", plan.checkpointing.units.size());
    if (plan.checkpoint_offload) knobs += " +ckpt.off";
    if (plan.pipeline_stages > 1) {
      const PipelineBalance& b = plan.pipeline.balance;
      knobs += fmt::format(" pp {} {}", plan.pipeline_stages, plan.pipeline.schedule);
      if (plan.pipeline.checkpoint != "never") knobs += " pipe-ckpt " + plan.pipeline.checkpoint;
      if (b.mode == PipelineBalance::Mode::memory) knobs += " balance memory";
      if (b.mode == PipelineBalance::Mode::units) knobs += fmt::format(" balance [{}]", fmt::join(b.units, ","));
    }
    if (plan.offload_model.enabled) knobs += fmt::format(" offload_model {} slices", plan.offload_model.slices);
    if (rp.equivalents > 0) knobs += fmt::format(" (+{} same-prediction variants)", rp.equivalents);
    fmt::print(stderr, "  {:>2}  {:>11.6f}  {:>10.1f}  {:>12}  {:>12}  {:<14} {}\n", ++i, p.step_time_s, p.samples_per_s,
               gib(p.device.total_bytes()), gib(p.host.total_bytes()), p.bound, knobs);
  }
  if (const auto* best = r.best()) {
    const sim::Throughput t = sim::throughput(r.model, r.cluster, best->plan, best->prediction.step_time_s);
    std::string line = fmt::format("  best plan, predicted: {:.6f} s per step", best->prediction.step_time_s);
    if (t.tokens_per_s_per_gpu > 0) line += fmt::format(", {:.0f} tokens/s per GPU", t.tokens_per_s_per_gpu);
    if (t.mfu > 0) line += fmt::format(", MFU {:.1f}%", 100 * t.mfu);
    fmt::print(stderr, "{}\n  time model: {}\n", line, sim::calibration_label(r.cluster));
  }
  const auto& d = r.default_plan;
  if (d.simulated && !d.fits)
    fmt::print(stderr, "  default (DDP, no offload) does not fit: needs {} of device memory, {} available\n",
               gib(d.device_needed_bytes), gib(d.device_available_bytes));
  if (!r.best()) fmt::print(stderr, "  no plan fits; see the rejections in the report\n");
}

int run_max_model(const TuneArgs& a, const ClusterProfile& cluster, tuner::TuneOptions options, const Globals& g) {
  if (a.max_model != "gpt")
    throw ExitError(kBadInput, fmt::format("--max-model {}: unknown family (families: gpt)", a.max_model));
  tuner::MaxModelOptions mo;
  mo.seq = a.seq;
  mo.tune = options;
  auto result = tuner::max_model(cluster, a.constraints, mo);
  std::string summary = tuner::max_model_markdown(result, mo);
  if (!g.quiet) fmt::print(stderr, "{}", summary);
  if (!a.output_dir.empty() && result.largest_tune) {
    tuner::write_reports(*result.largest_tune, a.output_dir);
    if (!g.quiet) fmt::print(stderr, "wrote the largest model's tune into {}\n", a.output_dir);
  }
  if (g.json && result.largest_tune) fmt::print("{}", tuner::tune_json(*result.largest_tune));
  return result.largest >= 0 ? kOk : kBadInput;
}

int run_tune(TuneArgs& a, const Globals& g) {
  if (a.model.empty() == a.max_model.empty())
    throw ExitError(kBadInput, "give exactly one of --model FILE and --max-model FAMILY");
  auto cluster = resolve_cluster(a.cluster);
  if (a.device_memory_gib > 0) cluster.device.mem_bytes = static_cast<std::int64_t>(a.device_memory_gib * double(1ull << 30));
  if (!a.knobs.empty()) a.constraints.knobs = tuner::parse_knobs(a.knobs);
  for (const auto& f : a.fixes) {
    auto [k, v] = tuner::parse_fix(f);
    a.constraints.fixed[k] = v;
  }
  tuner::validate(a.constraints);
  if (!a.output_dir.empty()) tuner::check_report_folder(a.output_dir);  // before any work
  tuner::TuneOptions options;
  options.set_top_k(a.top_k).set_threads(a.threads);
  if (!g.quiet) options.set_progress(tuner::stderr_progress_bar());
  if (!a.max_model.empty()) return run_max_model(a, cluster, options, g);
  auto model = read_document<ModelProfile>(a.model);
  if (a.compare_granularity) {  // before the tune: a model that cannot be cut both ways is one line, exit 1
    tuner::TuneOptions quiet = options;
    quiet.set_explain(false).set_progress(nullptr);
    const tuner::GranularityResult gr = tuner::compare_granularities(model, cluster, a.constraints, quiet);
    if (!g.quiet) fmt::print(stderr, "unit granularity at zero stage 3:\n{}", tuner::granularity_markdown(gr));
  }
  tuner::TuneResult result = tuner::tune(model, cluster, a.constraints, options);
  if (!g.quiet) {
    print_ranking(result);
    if (result.best())
      for (const auto& note : result.best()->prediction.notes) fmt::print(stderr, "note on the best plan: {}\n", note);
  }
  if (!a.output_dir.empty()) {
    auto files = tuner::write_reports(result, a.output_dir);
    if (!g.quiet) fmt::print(stderr, "wrote {} files into {} (report.md, report.html, tune.json, exports)\n",
                             files.size(), a.output_dir);
  }
  if (g.json) fmt::print("{}", tuner::tune_json(result));
  return result.best() ? kOk : kBadInput;
}

}  // namespace

Action add_tune(CLI::App& app, const Globals& globals) {
  auto a = std::make_shared<TuneArgs>();
  std::string knob_help = "Knobs that may vary (comma-separated, or a Plan knob's name; default all):";
  for (const auto& k : tuner::knob_names()) knob_help += " " + k;
  app.add_option("--model", a->model, "ModelProfile (from zeroplan profile)")->check(model_profile_file());
  app.add_option("--max-model", a->max_model, "Instead of --model: the largest model of a family (gpt) that trains");
  app.add_option("--seq", a->seq, "With --max-model: sequence length")->capture_default_str();
  app.add_option("--cluster", a->cluster, "Cluster: shipped NAME[:NODES] or FILE[:NODES]")->required();
  app.add_option("--global-batch", a->constraints.global_batch, "Samples per optimizer step")->required()
      ->check(positive());
  app.add_option("--world-size", a->constraints.world_size, "Ranks (default: as many whole nodes as divide the batch)")
      ->check(number_in(1, 1 << 20));
  app.add_option("--nodes", a->constraints.nodes, "Nodes available (default: the cluster's)")->check(number_in(1, 1 << 20));
  app.add_option("--knobs", a->knobs, knob_help);
  app.add_option("--fix", a->fixes, "Fixed knob key=value, e.g. --fix zero_stage=3 (repeatable; knobs: zeroplan plan "
                 "--fields; presets precision=fp32|bf16|fp16, buckets=default|large)");
  app.add_option("--for", a->constraints.for_tool,
                 "Only plans this tool can express (its export writes a config): deepspeed, fsdp2 (the train_fsdp2.py "
                 "script), accelerate, fairscale, zeroplan")
      ->check(CLI::IsMember(tuner::export_tools()));
  app.add_option("--device-headroom", a->constraints.device_headroom_fraction, "Share of device memory kept free [0,1)");
  app.add_option("--device-headroom-bytes", a->constraints.device_headroom_bytes, "Device bytes kept free");
  app.add_option("--host-headroom", a->constraints.host_headroom_fraction, "Share of host memory kept free [0,1)");
  app.add_option("--device-memory-gib", a->device_memory_gib, "Override the device memory of the cluster (GiB)")
      ->check(number_in(0, 1e9, true));
  app.add_flag("--allow-approximate-averaging", a->constraints.allow_approximate_averaging,
               "Let LocalSGD/SlowMo vary (they change the optimisation)");
  app.add_option("--optimizer", a->constraints.optimizer, "adam | adamw | sgd")->capture_default_str();
  app.add_flag("--compare-granularity", a->compare_granularity,
               "With an analytic GPT (profile --analytic gpt): first the best stage-3 plan with block units and with "
               "attention and MLP as separate units, and which wins");
  app.add_option("--top-k", a->top_k, "Plans in the ranking")->capture_default_str()->check(number_in(1, 1 << 20));
  app.add_option("--threads", a->threads, "Search threads (0: all cores)")->capture_default_str()->check(threads_option());
  app.add_option("-o,--output-dir", a->output_dir, "Write report.md, report.html, tune.json and the exports here")
      ->check(output_folder());
  return [a, &globals] { return run_tune(*a, globals); };
}

}  // namespace zeroplan::cli
