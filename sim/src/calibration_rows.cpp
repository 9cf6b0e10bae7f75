// The public table's rows as calibration rows (calibrate.h): llm-foundry's MPT training benchmarks.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "zeroplan/profiles/analytic.h"
#include "zeroplan/sim/calibrate.h"
#include "zeroplan/sim/errors.h"

namespace zeroplan::sim {

std::string cluster_for_benchmark_device(std::string_view device) {
  if (device == "h100_80gb") return "h100-sxm-80gb";
  if (device == "a100_80gb") return "a100-sxm-80gb";
  if (device == "a100_40gb") return "a100-sxm-40gb";
  return "";
}

std::vector<CalibrationRow> benchmark_rows(const nlohmann::json& doc, std::string_view device,
                                           std::string_view cluster_name) {
  if (!doc.is_object() || doc.value("schema", "") != "zeroplan.calibration_rows/1")
    throw SimError("calibration rows: not a zeroplan.calibration_rows/1 document");
  const nlohmann::json& models = doc.at("models");
  std::vector<std::string> sizes;  // in the document's order: the held-out split alternates over them
  for (const auto& [size, m] : models.items()) sizes.push_back(size);
  // nlohmann::json sorts object keys: order the sizes by their parameter scale instead (125m < 1b < 70b).
  std::sort(sizes.begin(), sizes.end(), [&](const std::string& a, const std::string& b) {
    auto scale = [&](const std::string& s) {
      const auto& m = models.at(s);
      return m.at("n_layers").get<double>() * m.at("d_model").get<double>() * m.at("d_model").get<double>();
    };
    return scale(a) < scale(b);
  });
  std::vector<CalibrationRow> rows;
  for (const auto& r : doc.at("rows")) {
    if (r.at("device").get<std::string>() != device) continue;
    const std::string size = r.at("model").get<std::string>();
    if (!models.contains(size)) throw SimError(fmt::format("calibration rows: model {} has no sizes", size));
    const auto& m = models.at(size);
    const int gpus = r.at("gpus").get<int>(), mb = r.at("micro_batch").get<int>();
    const int accum = r.at("grad_accum").get<int>();
    const std::int64_t seq = r.at("seq").get<std::int64_t>();
    AnalyticDecoderOptions o;
    o.family = "mpt";
    o.name = "mpt-" + size;
    o.layers = m.at("n_layers").get<std::int64_t>();
    o.hidden = m.at("d_model").get<std::int64_t>();
    o.heads = m.at("n_heads").get<std::int64_t>();
    o.intermediate = m.at("expansion_ratio").get<std::int64_t>() * o.hidden;
    o.vocab = m.at("vocab_size").get<std::int64_t>();
    o.seq = seq;
    o.batch = mb;
    o.dtype = "bf16";
    o.flash_attention = true;
    o.biases = true;
    o.learned_positions = seq;
    CalibrationRow row;
    row.model = analytic_decoder(o);
    std::int64_t params = 0;
    for (const UnitProfile& u : row.model.units) params += u.params * u.count;
    if (params != r.at("num_params").get<std::int64_t>())
      throw SimError(fmt::format("calibration rows: mpt {} at seq {} counts {} parameters, the table {}", size, seq,
                                 params, r.at("num_params").get<std::int64_t>()));
    if (gpus % 8 != 0) throw SimError(fmt::format("calibration rows: {} GPUs is not whole 8-GPU nodes", gpus));
    row.cluster = resolve_cluster(fmt::format("{}:{}", cluster_name, gpus / 8));
    Plan& p = row.plan;
    p.world_size = gpus;
    p.micro_batch = mb;
    p.microbatches = accum;
    p.global_batch = mb * accum * gpus;
    const std::string sharding = r.at("sharding").get<std::string>();
    if (sharding != "FULL_SHARD" && sharding != "SHARD_GRAD_OP")
      throw SimError(fmt::format("calibration rows: sharding {} is not read", sharding));
    p.zero_stage = sharding == "FULL_SHARD" ? 3 : 2;
    p.reshard_after_forward = p.zero_stage == 3;
    p.precision.param_dtype = p.precision.compute_dtype = "bf16";
    p.precision.reduce_dtype = r.at("mp_mode").get<std::string>() == "PURE" ? "bf16" : "fp32";
    p.precision.master_fp32 = true;
    p.optimizer.name = "adamw";
    if (r.at("activation_checkpointing").get<bool>()) p.checkpointing.mode = Checkpointing::Mode::all;
    if (r.at("activation_cpu_offload").get<bool>()) p.offload.activations_ratio = 1;
    const double tokens = static_cast<double>(p.global_batch) * static_cast<double>(seq);
    row.measured_step_s = tokens / r.at("tokens_per_s").get<double>();
    row.tokens_per_gpu_step = tokens / gpus;
    row.held_out = (std::find(sizes.begin(), sizes.end(), size) - sizes.begin()) % 2 == 1;
    row.label = fmt::format("{} seq {} x{} mb {}x{}{}{}", size, seq, gpus, mb, accum,
                            p.zero_stage == 2 ? " zero2" : "", p.checkpointing.mode == Checkpointing::Mode::all ? " ckpt" : "");
    rows.push_back(std::move(row));
  }
  if (rows.empty()) throw SimError(fmt::format("calibration rows: no row on device {}", device));
  return rows;
}

}  // namespace zeroplan::sim
