#include "zeroplan/tuner/constraints.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "text.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/knobs.h"
#include "zeroplan/tuner/exports.h"

namespace zeroplan::tuner {
namespace {

// --fix keys for a whole dimension at once (presets over several knobs); the rest are registry knobs.
const std::vector<std::string> kPresets = {"precision", "buckets"};

bool is_preset(std::string_view key) { return std::find(kPresets.begin(), kPresets.end(), key) != kPresets.end(); }

[[noreturn]] void fix_error(const std::string& key, const std::string& value, const std::string& what) {
  throw SchemaError(fmt::format("tune: --fix {}={}: {}", key, value, what));
}

}  // namespace

const std::vector<std::string>& knob_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& k : tune_knobs()) n.push_back(k.name);
    return n;
  }();
  return names;
}

std::string_view knob_description(std::string_view knob) {
  for (const auto& k : tune_knobs())
    if (knob == k.name) return k.description;
  return {};
}

const std::vector<std::string>& fixable_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k = kPresets;
    for (const Knob& info : knobs())
      if (info.name != "world_size" && info.name != "global_batch") k.push_back(info.name);
    // A dimension's name fixes its one knob (offload_params: offload.params), or is a preset.
    for (const auto& name : knob_names()) k.push_back(name);
    std::sort(k.begin(), k.end());
    k.erase(std::unique(k.begin(), k.end()), k.end());
    return k;
  }();
  return keys;
}

bool TuneConstraints::fixes(std::string_view knob_name) const {
  for (const auto& [key, value] : fixed) {
    if (key == knob_name) return true;
    if (const Knob* k = find_knob(key); k && k->name == knob_name) return true;
  }
  return false;
}

bool TuneConstraints::varies(std::string_view knob) const {
  const auto& names = knob_names();
  if (std::find(names.begin(), names.end(), knob) == names.end())  // a bug: the tuner names a knob the registry lacks
    throw std::logic_error(fmt::format("tune knob \"{}\" is not in the knob registry", knob));
  if (!knobs.empty() && !knobs.contains(std::string(knob))) return false;
  if (fixed.contains(std::string(knob))) return false;
  // The precision preset names every precision knob: fixing it fixes the 16-bit broadcasts and the fp32
  // reduce-scatter too (--fix precision=fp32 ranks no plan with broadcast_fp16).
  if ((knob == "broadcast_fp16" || knob == "fp32_reduce_scatter") && fixed.contains("precision")) return false;
  for (const Knob* member : tune_knob_members(knob))
    if (fixes(member->name)) return false;
  return true;
}

std::set<std::string> parse_knobs(std::string_view list) {
  std::set<std::string> out;
  const auto& names = knob_names();
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t end = list.find(',', start);
    if (end == std::string_view::npos) end = list.size();
    std::string item(list.substr(start, end - start));
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) {
      // A dimension by its name, or by a knob it moves (offload.params -> offload_params).
      std::string dim = item;
      if (std::find(names.begin(), names.end(), item) == names.end())
        if (const Knob* k = find_knob(item); k && !k->tune_knob.empty()) dim = k->tune_knob;
      if (std::find(names.begin(), names.end(), dim) == names.end()) {
        const std::string near = text::closest(item, names);
        throw SchemaError(fmt::format("tune: unknown knob \"{}\"{}; knobs: {}", item,
                                      near.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", near),
                                      text::join(names)));
      }
      out.insert(dim);
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
  if (key == "world_size" || key == "global_batch")
    throw SchemaError(fmt::format("tune: --fix {}: give it as --{}", key, key == "world_size" ? "world-size" : "global-batch"));
  if (is_preset(key)) return {std::move(key), std::move(value)};
  const Knob* k = find_knob(key);
  if (!k) {
    const auto& keys = fixable_keys();
    const std::string near = text::closest(key, keys);
    throw SchemaError(fmt::format("tune: --fix: unknown key \"{}\"{}; keys: {}", key,
                                  near.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", near), text::join(keys)));
  }
  // The value's type and range (set on a default plan, checked by validate's single-field checks), now: a
  // value out of range would otherwise leave nothing to search ("0 candidates") without naming the option.
  Plan probe;
  set_knob_text(probe, *k, value, "tune: --fix");
  try {
    validate_fields(probe);
  } catch (const SchemaError& e) {
    std::string why = e.what();
    if (why.rfind("plan: ", 0) == 0) why.erase(0, 6);
    throw SchemaError(fmt::format("tune: --fix {}={}: {}", key, value, why));
  }
  return {k->name, std::move(value)};  // the registry's spelling (offload_params -> offload.params)
}

void apply_fixed(Plan& p, const std::string& key, const std::string& v) {
  if (key == "precision") {
    if (v == "fp32") p.precision = Precision{};
    else if (v == "bf16" || v == "fp16") {
      Precision q;
      q.param_dtype = q.compute_dtype = q.reduce_dtype = v;
      q.master_fp32 = true;
      q.loss_scale.mode = v == "fp16" ? LossScale::Mode::dynamic : LossScale::Mode::none;
      p.precision = q;
    } else fix_error(key, v, "expected fp32, bf16 or fp16");
  } else if (key == "buckets") {
    if (v == "default") {
      const Buckets was = p.buckets;  // the sizes only: prefetch is a knob of its own
      p.buckets = Buckets{};
      p.buckets.prefetch = was.prefetch;
      p.buckets.prefetch_depth = was.prefetch_depth;
    }
    else if (v == "large") {
      const Buckets d{};
      p.buckets.all_reduce_bucket_bytes = 4 * d.all_reduce_bucket_bytes;
      p.buckets.reduce_buffer_elems = 4 * d.reduce_buffer_elems;
      p.buckets.allgather_bucket_bytes = 4 * d.allgather_bucket_bytes;
    } else fix_error(key, v, "expected default or large");
  } else {
    const auto fix = parse_fix(key + "=" + v);  // throws the unknown-key message
    set_knob_text(p, knob(fix.first, "tune: --fix"), v, "tune: --fix");
  }
}

void validate(const TuneConstraints& c) {
  if (c.global_batch < 1) throw SchemaError(fmt::format("tune: global_batch must be >= 1 (got {})", c.global_batch));
  const auto& tools = export_tools();
  if (!c.for_tool.empty() && std::find(tools.begin(), tools.end(), c.for_tool) == tools.end())
    throw SchemaError(fmt::format("tune: --for {}: unknown tool ({})", c.for_tool, fmt::join(tools, ", ")));
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
