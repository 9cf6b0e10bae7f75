// The knob registry: every Plan knob once, under one name (its JSON path, dotted: "offload.params"), with
// its type, range, default, the default that depends on other knobs, a one-line description, and which
// of simulate / tune / run support it. `--set`, `tune --fix` / `--knobs`, the tuner's search space, the
// executor's list of what it does not run and `zeroplan plan --fields` all read it.
//
//   const Knob& k = knob("offload.params");          // or an older spelling: knob("offload_params")
//   set_knob_text(plan, k, "true", "--set");          // throws "--set offload.params=x: expected true or false"
//   apply_dependent_defaults(before, plan, {"zero_stage"});  // reshard_after_forward follows zero_stage 3
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "zeroplan/profiles/plan.h"

namespace zeroplan {

enum class KnobType { integer, boolean, number, choice, checkpointing, loss_scale, number_pair, balance };

// What a component does with a knob: honours it, rejects a plan that uses it, or accepts it with no effect.
enum class Support { yes, no, ignored };

struct Knob {
  std::string name;                 // the one spelling: the JSON path, dotted
  KnobType type = KnobType::integer;
  std::vector<std::string> choices; // KnobType::choice only
  std::string range;                // "0..3", ">= 1", "[0, 1]", "fp32 | fp16 | bf16"
  std::string default_text;         // as `zeroplan plan --fields` prints it; dependent: "zero_stage == 3"
  std::string description;          // one line
  Support simulate = Support::yes, tune = Support::yes, run = Support::yes;
  std::string tune_knob;            // the `tune --knobs` dimension that varies it; "" = never searched
  std::vector<std::string> aliases; // older spellings accepted on input ("offload_params")

  // Sets the knob from JSON (type-checked; errors name `path`).
  void (*assign)(Plan& plan, const nlohmann::json& value, const std::string& path) = nullptr;
  // The value it takes when not given, computed from the other knobs; nullopt: none (keep the value).
  std::optional<nlohmann::json> (*dependent_default)(const Plan& plan) = nullptr;
  // Whether a plan uses the feature (for the unsupported lists); null: its value differs from the default.
  bool (*in_use)(const Plan& plan) = nullptr;

  std::string json_pointer() const;  // "/offload/params"
};

// A dimension of the tuner's search (`tune --knobs NAME`): the knobs whose tune_knob is NAME move together.
struct TuneKnob {
  std::string name;
  std::string description;
};

// Every knob, in Plan order.
const std::vector<Knob>& knobs();
// The tuner's dimensions, in canonical order (the order "why this plan" walks them).
const std::vector<TuneKnob>& tune_knobs();
// The knobs a dimension moves, in registry order.
std::vector<const Knob*> tune_knob_members(std::string_view tune_knob);

// By name or older spelling; null when unknown.
const Knob* find_knob(std::string_view name);
// By name or older spelling. Throws SchemaError "<where>: unknown knob "x" (did you mean ...); knobs: ...".
const Knob& knob(std::string_view name, std::string_view where = "plan");
// Every knob's name, in registry order.
std::vector<std::string> knob_names_all();
// The names close to `word` (same dotted prefix, or a small edit distance), for error messages.
std::vector<std::string> close_knob_names(std::string_view word);

// The knob's value in `plan`, as Plan JSON writes it.
nlohmann::json knob_value(const Plan& plan, const Knob& knob);
// Parses command-line text for the knob (true/false/yes/no/on/off/1/0, numbers, names, checkpointing
// "none" | "all" | "1,3" | "[1,3]", loss scale "none" | "dynamic" | a number, betas "0.9,0.95", pipeline
// balance "time" | "memory" | "3,5") and sets it.
// Throws SchemaError "<where> <knob>=<text>: expected ..."; ranges are left to validate(plan).
void set_knob_text(Plan& plan, const Knob& knob, std::string_view text, std::string_view where);

// After `after` was made from `before` by giving the knobs named in `given` their values: every knob
// with a dependent default that is not in `given`, and whose value in `before` was its dependent default
// there, takes its dependent default in `after` (in registry order). A user's value always wins.
void apply_dependent_defaults(const Plan& before, Plan& after, const std::set<std::string>& given);
// For Plan JSON: every knob with a dependent default that `document` leaves out takes it.
void fill_dependent_defaults(Plan& plan, const nlohmann::json& document);

// "name value" for each knob `component` rejects (Support::no) that `plan` uses, in registry order.
enum class Component { simulate, tune, run };
std::vector<std::string> unsupported_knobs(const Plan& plan, Component component);
// The tune knobs all of whose knobs `component` honours (Support::yes), comma-separated, canonical order:
// for run, what autopilot lets the tuner vary.
std::string tune_knobs_supported_by(Component component);

// The executor's refusals: plans validate accepts (simulate predicts them, tune may propose them) that
// `zeroplan run` and zeroplan.wrap do not run, each with the knobs it reads, what it refuses in a few
// words (`plan --fields`) and, for a plan that breaks it, the one line the executor refuses it with.
struct RunRule {
  std::vector<std::string> knobs;
  std::string refuses;
  std::function<std::string(const Plan&)> broken;  // "" when the plan is run
};
const std::vector<RunRule>& run_rules();
// The first run rule `plan` breaks, its line; "" when the executor runs it.
std::string run_refusal(const Plan& plan);

// `zeroplan plan --fields`: the registry as a text table (one row per knob) and as JSON.
std::string knob_table_text();
nlohmann::ordered_json knob_table_json();
std::string_view support_name(Support s);  // "yes" | "no" | "ignored"

}  // namespace zeroplan
