// What the user asks of a tune: the batch, the devices, the memory headroom, which knobs may vary and
// which are fixed. `zeroplan tune --knobs a,b --fix k=v` fills this.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "zeroplan/profiles/plan.h"

namespace zeroplan::tuner {

// Knobs that may vary, by name (--knobs): the tuner's dimensions of the knob registry (knobs.h,
// tune_knobs()), each moving the Plan knobs whose tune_knob it is. --knobs also accepts a Plan knob's
// name for its dimension (offload.params for offload_params).
const std::vector<std::string>& knob_names();

// One line per knob, for --help and error messages.
std::string_view knob_description(std::string_view knob);

// Keys --fix accepts: every registry knob but world_size and global_batch (tune's own options), by name
// or older spelling (offload_params, lr), the dimensions' names, and the presets precision
// (fp32 | bf16 | fp16) and buckets (default | large). Sorted.
const std::vector<std::string>& fixable_keys();

struct TuneConstraints {
  int global_batch = 0;        // samples per optimizer step, over all ranks; required (>= 1)
  int world_size = 0;          // ranks; 0: the most whole nodes (of `nodes`) whose rank count divides global_batch
  int nodes = 0;               // nodes available; 0: the cluster's
  double device_headroom_fraction = 0;   // keep this share of device memory free, [0, 1)
  std::int64_t device_headroom_bytes = 0;  // and these bytes
  double host_headroom_fraction = 0;
  std::int64_t host_headroom_bytes = 0;
  std::set<std::string> knobs;             // knobs that may vary; empty: all of knob_names()
  std::map<std::string, std::string> fixed;  // --fix key=value; a fixed knob does not vary
  bool allow_approximate_averaging = false;  // LocalSGD / SlowMo change the optimisation: off unless asked
  std::string optimizer = "adam";            // "adam" | "adamw" | "sgd": part of the training recipe, not tuned
  // Only plans the executor runs (knobs.h run_rules: autopilot runs what it picks); the others are pruned
  // and counted under "run: <the rule's line>".
  bool runnable = false;
  // tune --for: only plans this tool can express (its export writes a config, exports.h), "" = any.
  // "deepspeed" | "fsdp2" (the training script) | "accelerate" (FSDP1 or FSDP2 config) | "fairscale" | "zeroplan".
  std::string for_tool;

  TuneConstraints& set_global_batch(int v) { global_batch = v; return *this; }
  TuneConstraints& set_world_size(int v) { world_size = v; return *this; }
  TuneConstraints& set_nodes(int v) { nodes = v; return *this; }
  TuneConstraints& set_device_headroom_fraction(double v) { device_headroom_fraction = v; return *this; }
  TuneConstraints& set_device_headroom_bytes(std::int64_t v) { device_headroom_bytes = v; return *this; }
  TuneConstraints& set_host_headroom_fraction(double v) { host_headroom_fraction = v; return *this; }
  TuneConstraints& set_host_headroom_bytes(std::int64_t v) { host_headroom_bytes = v; return *this; }
  TuneConstraints& set_knobs(std::set<std::string> v) { knobs = std::move(v); return *this; }
  TuneConstraints& fix(std::string key, std::string value) { fixed[std::move(key)] = std::move(value); return *this; }
  TuneConstraints& set_allow_approximate_averaging(bool v) { allow_approximate_averaging = v; return *this; }
  TuneConstraints& set_optimizer(std::string v) { optimizer = std::move(v); return *this; }
  TuneConstraints& set_runnable(bool v) { runnable = v; return *this; }
  TuneConstraints& set_for_tool(std::string v) { for_tool = std::move(v); return *this; }

  // True when `knob` may vary: listed (or the list is empty) and not fixed by any key it groups.
  // `knob` must be one of knob_names() (std::logic_error otherwise: a bug).
  bool varies(std::string_view knob) const;
  // True when a --fix key names the registry knob `knob_name` (by any spelling).
  bool fixes(std::string_view knob_name) const;
};

// "a,b,c" -> {a, b, c}. Throws SchemaError naming an unknown knob (with did-you-mean) and listing all.
std::set<std::string> parse_knobs(std::string_view list);
// "key=value" -> (key, value), the key in the registry's spelling (presets as given). Throws SchemaError on
// a missing '=' or an unknown key.
std::pair<std::string, std::string> parse_fix(std::string_view assignment);

// Sets one fixed key on a plan. Throws SchemaError naming the key and the value when the value does
// not parse ("--fix zero_stage=x: expected an integer").
void apply_fixed(Plan& plan, const std::string& key, const std::string& value);

// Throws SchemaError when the constraints make no sense on their own (batch < 1, headroom outside
// [0, 1), unknown optimizer, unknown knob or key), naming the field and the number.
void validate(const TuneConstraints& constraints);

}  // namespace zeroplan::tuner
