#include "zeroplan/tuner/constraints.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include "text.h"
#include "zeroplan/profiles/errors.h"

namespace zeroplan::tuner {
namespace {

struct KnobInfo {
  const char* name;
  const char* description;
  std::vector<std::string> keys;  // --fix keys that pin (part of) this knob
};

const std::vector<KnobInfo>& knob_table() {
  static const std::vector<KnobInfo> table = {
      {"zero_stage", "ZeRO stage 0 (DDP), 1 (OSS), 2 (SDP), 3 (FSDP)", {"zero_stage"}},
      {"reshard_after_forward", "stage 3: free gathered parameters after forward (FULL_SHARD)",
       {"reshard_after_forward"}},
      {"prefetch", "stage 3: gather the next unit's parameters while computing", {"prefetch"}},
      {"offload_params", "parameters on the host, copied in before use (stage 3)", {"offload_params"}},
      {"offload_grads", "gradients copied to the host for the host optimizer", {"offload_grads"}},
      {"offload_optimizer", "optimizer state on the host; the step runs there (stage >= 1)", {"offload_optimizer"}},
      {"offload_activations", "share of saved activations sent to the host: the smallest that fits",
       {"offload_activations"}},
      {"offload_model", "fairscale OffloadModel: slices, checkpoint_activation, microbatches",
       {"offload_model", "offload_model_slices", "offload_model_checkpoint_activation", "offload_model_microbatches"}},
      {"checkpointing", "activation checkpointing: none, all, or the cheapest set of units that fits",
       {"checkpointing"}},
      {"micro_batch", "micro batch x microbatches (gradient accumulation) dividing the global batch",
       {"micro_batch", "microbatches"}},
      {"localsgd", "LocalSGD / SlowMo across nodes (needs allow_approximate_averaging)",
       {"localsgd", "localsgd_frequency", "slowmo_frequency", "slowmo_momentum"}},
      {"precision", "fp32, bf16 or fp16 mixed precision (dtypes the device supports)",
       {"precision", "param_dtype", "compute_dtype", "reduce_dtype", "master_fp32", "loss_scale"}},
      {"buckets", "bucket sizes: default (25 MiB, 2^23 elements) or large (4x)",
       {"buckets", "all_reduce_bucket_bytes", "reduce_buffer_elems", "allgather_bucket_bytes"}},
      {"flat_params", "optimizer steps on one flat buffer per unit", {"flat_params"}},
      {"broadcast_fp16", "stage 1-2 (OSS): broadcast updated shards in fp16", {"broadcast_fp16"}},
      {"fp32_reduce_scatter", "stage >= 2: reduce-scatter gradients in fp32", {"fp32_reduce_scatter"}},
      {"adascale", "AdaScale learning-rate gain (SGD only)", {"adascale"}},
  };
  return table;
}

const std::vector<std::string> kExtraKeys = {"optimizer", "lr", "momentum", "weight_decay", "pipeline_stages"};

[[noreturn]] void fix_error(const std::string& key, const std::string& value, const std::string& what) {
  throw SchemaError(fmt::format("tune: --fix {}={}: {}", key, value, what));
}

int parse_int(const std::string& key, const std::string& v) {
  int out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size()) fix_error(key, v, "expected an integer");
  return out;
}

std::int64_t parse_int64(const std::string& key, const std::string& v) {
  std::int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size()) fix_error(key, v, "expected an integer");
  return out;
}

double parse_double(const std::string& key, const std::string& v) {
  try {
    std::size_t used = 0;
    const double d = std::stod(v, &used);
    if (used != v.size() || !std::isfinite(d)) fix_error(key, v, "expected a number");
    return d;
  } catch (const std::logic_error&) {
    fix_error(key, v, "expected a number");
  }
}

bool parse_bool(const std::string& key, const std::string& v) {
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  fix_error(key, v, "expected true or false");
}

std::string parse_dtype(const std::string& key, const std::string& v) {
  if (v == "fp32" || v == "fp16" || v == "bf16") return v;
  fix_error(key, v, "expected fp32, fp16 or bf16");
}

}  // namespace

const std::vector<std::string>& knob_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& k : knob_table()) n.emplace_back(k.name);
    return n;
  }();
  return names;
}

std::string_view knob_description(std::string_view knob) {
  for (const auto& k : knob_table())
    if (knob == k.name) return k.description;
  return {};
}

const std::vector<std::string>& fixable_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k = kExtraKeys;
    for (const auto& info : knob_table()) k.insert(k.end(), info.keys.begin(), info.keys.end());
    std::sort(k.begin(), k.end());
    k.erase(std::unique(k.begin(), k.end()), k.end());
    return k;
  }();
  return keys;
}

bool TuneConstraints::varies(std::string_view knob) const {
  if (!knobs.empty() && !knobs.contains(std::string(knob))) return false;
  for (const auto& k : knob_table()) {
    if (knob != k.name) continue;
    for (const auto& key : k.keys)
      if (fixed.contains(key)) return false;
    return true;
  }
  return false;
}

std::set<std::string> parse_knobs(std::string_view list) {
  std::set<std::string> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    std::string item(list.substr(start, end - start));
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) {
      const auto& names = knob_names();
      if (std::find(names.begin(), names.end(), item) == names.end()) {
        const std::string near = text::closest(item, names);
        throw SchemaError(fmt::format("tune: unknown knob \"{}\"{}; knobs: {}", item,
                                      near.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", near),
                                      text::join(names)));
      }
      out.insert(item);
    }
    start = end + 1;
  }
  return out;
}

std::pair<std::string, std::string> parse_fix(std::string_view assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0)
    throw SchemaError(fmt::format("tune: --fix \"{}\": expected key=value", assignment));
  std::string key(assignment.substr(0, eq));
  std::string value(assignment.substr(eq + 1));
  const auto& keys = fixable_keys();
  if (!std::binary_search(keys.begin(), keys.end(), key)) {
    const std::string near = text::closest(key, keys);
    throw SchemaError(fmt::format("tune: --fix: unknown key \"{}\"{}; keys: {}", key,
                                  near.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", near), text::join(keys)));
  }
  return {std::move(key), std::move(value)};
}

void apply_fixed(Plan& p, const std::string& key, const std::string& v) {
  if (key == "zero_stage") p.zero_stage = parse_int(key, v);
  else if (key == "reshard_after_forward") p.reshard_after_forward = parse_bool(key, v);
  else if (key == "prefetch") p.buckets.prefetch = parse_bool(key, v);
  else if (key == "offload_params") p.offload.params = parse_bool(key, v);
  else if (key == "offload_grads") p.offload.grads = parse_bool(key, v);
  else if (key == "offload_optimizer") p.offload.optimizer = parse_bool(key, v);
  else if (key == "offload_activations") p.offload.activations_ratio = parse_double(key, v);
  else if (key == "offload_model") p.offload_model.enabled = parse_bool(key, v);
  else if (key == "offload_model_slices") p.offload_model.slices = parse_int(key, v);
  else if (key == "offload_model_checkpoint_activation") p.offload_model.checkpoint_activation = parse_bool(key, v);
  else if (key == "offload_model_microbatches") p.offload_model.microbatches = parse_int(key, v);
  else if (key == "checkpointing") {
    Checkpointing c;
    if (v == "none") c.mode = Checkpointing::Mode::none;
    else if (v == "all") c.mode = Checkpointing::Mode::all;
    else {
      c.mode = Checkpointing::Mode::units;
      std::size_t start = 0;
      while (start <= v.size()) {
        std::size_t end = v.find(',', start);
        if (end == std::string::npos) end = v.size();
        c.units.push_back(parse_int(key, v.substr(start, end - start)));
        start = end + 1;
      }
      if (!std::is_sorted(c.units.begin(), c.units.end()) ||
          std::adjacent_find(c.units.begin(), c.units.end()) != c.units.end())
        fix_error(key, v, "unit indices must be strictly increasing");
    }
    p.checkpointing = c;
  } else if (key == "micro_batch") p.micro_batch = parse_int(key, v);
  else if (key == "microbatches") p.microbatches = parse_int(key, v);
  else if (key == "localsgd" || key == "localsgd_frequency") p.localsgd_frequency = parse_int(key, v);
  else if (key == "slowmo_frequency") p.slowmo_frequency = parse_int(key, v);
  else if (key == "slowmo_momentum") p.slowmo_momentum = parse_double(key, v);
  else if (key == "precision") {
    if (v == "fp32") p.precision = Precision{};
    else if (v == "bf16" || v == "fp16") {
      Precision q;
      q.param_dtype = q.compute_dtype = q.reduce_dtype = v;
      q.master_fp32 = true;
      q.loss_scale.mode = v == "fp16" ? LossScale::Mode::dynamic : LossScale::Mode::none;
      p.precision = q;
    } else fix_error(key, v, "expected fp32, bf16 or fp16");
  } else if (key == "param_dtype") p.precision.param_dtype = parse_dtype(key, v);
  else if (key == "compute_dtype") p.precision.compute_dtype = parse_dtype(key, v);
  else if (key == "reduce_dtype") p.precision.reduce_dtype = parse_dtype(key, v);
  else if (key == "master_fp32") p.precision.master_fp32 = parse_bool(key, v);
  else if (key == "loss_scale") {
    if (v == "none") p.precision.loss_scale = {LossScale::Mode::none, 0};
    else if (v == "dynamic") p.precision.loss_scale = {LossScale::Mode::dynamic, 0};
    else p.precision.loss_scale = {LossScale::Mode::fixed, parse_double(key, v)};
  } else if (key == "buckets") {
    if (v == "default") {
      const bool prefetch = p.buckets.prefetch;
      p.buckets = Buckets{};
      p.buckets.prefetch = prefetch;
    }
    else if (v == "large") {
      const Buckets d{};
      p.buckets.all_reduce_bucket_bytes = 4 * d.all_reduce_bucket_bytes;
      p.buckets.reduce_buffer_elems = 4 * d.reduce_buffer_elems;
      p.buckets.allgather_bucket_bytes = 4 * d.allgather_bucket_bytes;
    } else fix_error(key, v, "expected default or large");
  } else if (key == "all_reduce_bucket_bytes") p.buckets.all_reduce_bucket_bytes = parse_int64(key, v);
  else if (key == "reduce_buffer_elems") p.buckets.reduce_buffer_elems = parse_int64(key, v);
  else if (key == "allgather_bucket_bytes") p.buckets.allgather_bucket_bytes = parse_int64(key, v);
  else if (key == "flat_params") p.flat_params = parse_bool(key, v);
  else if (key == "broadcast_fp16") p.precision.broadcast_fp16 = parse_bool(key, v);
  else if (key == "fp32_reduce_scatter") p.precision.fp32_reduce_scatter = parse_bool(key, v);
  else if (key == "adascale") p.adascale = parse_bool(key, v);
  else if (key == "optimizer") {
    if (v != "adam" && v != "adamw" && v != "sgd") fix_error(key, v, "expected adam, adamw or sgd");
    p.optimizer.name = v;
  } else if (key == "lr") p.optimizer.lr = parse_double(key, v);
  else if (key == "momentum") p.optimizer.momentum = parse_double(key, v);
  else if (key == "weight_decay") p.optimizer.weight_decay = parse_double(key, v);
  else if (key == "pipeline_stages") p.pipeline_stages = parse_int(key, v);
  else {
    parse_fix(key + "=" + v);  // throws the unknown-key message
    fix_error(key, v, "not settable");
  }
}

void validate(const TuneConstraints& c) {
  if (c.global_batch < 1) throw SchemaError(fmt::format("tune: global_batch must be >= 1 (got {})", c.global_batch));
  if (c.world_size < 0) throw SchemaError(fmt::format("tune: world_size must be >= 0 (got {})", c.world_size));
  if (c.nodes < 0) throw SchemaError(fmt::format("tune: nodes must be >= 0 (got {})", c.nodes));
  auto fraction = [](const char* what, double f) {
    if (!(f >= 0 && f < 1)) throw SchemaError(fmt::format("tune: {} must be in [0, 1) (got {})", what, f));
  };
  fraction("device_headroom_fraction", c.device_headroom_fraction);
  fraction("host_headroom_fraction", c.host_headroom_fraction);
  if (c.device_headroom_bytes < 0 || c.host_headroom_bytes < 0)
    throw SchemaError(fmt::format("tune: headroom bytes must be >= 0 (got device {}, host {})",
                                  c.device_headroom_bytes, c.host_headroom_bytes));
  if (c.optimizer != "adam" && c.optimizer != "adamw" && c.optimizer != "sgd")
    throw SchemaError(fmt::format("tune: optimizer \"{}\" unknown; expected adam, adamw or sgd", c.optimizer));
  std::string list;
  for (const auto& k : c.knobs) list += k + ",";
  parse_knobs(list);
  for (const auto& [key, value] : c.fixed) {
    parse_fix(key + "=" + value);
    Plan scratch;
    apply_fixed(scratch, key, value);
  }
}

}  // namespace zeroplan::tuner
