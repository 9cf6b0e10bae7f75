// The knob registry as text: command-line values in, the `zeroplan plan --fields` table out.
#include <charconv>
#include <cmath>
#include <string>

#include "json_util.h"
#include "zeroplan/profiles/knobs.h"

namespace zeroplan {
namespace {

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(' ');
  if (b == std::string_view::npos) return {};
  return std::string(s.substr(b, s.find_last_not_of(' ') - b + 1));
}

std::optional<std::int64_t> parse_integer(std::string_view s) {
  const std::string t = trim(s);
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || p != t.data() + t.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_number(std::string_view s) {
  const std::string t = trim(s);
  try {
    std::size_t used = 0;
    const double d = std::stod(t, &used);
    if (used != t.size() || !std::isfinite(d)) return std::nullopt;
    return d;
  } catch (const std::logic_error&) {
    return std::nullopt;
  }
}

// "a, b or c".
std::string alternatives(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i == 0 ? "" : i + 1 == v.size() ? " or " : ", ") + v[i];
  return s;
}

// "1,3" or "[1, 3]" -> the numbers; nullopt when an item does not parse.
template <class T, class Parse>
std::optional<std::vector<T>> parse_list(std::string_view text, Parse parse) {
  std::string t = trim(text);
  if (t.size() >= 2 && t.front() == '[' && t.back() == ']') t = t.substr(1, t.size() - 2);
  std::vector<T> out;
  std::size_t start = 0;
  while (start <= t.size()) {
    std::size_t end = t.find(',', start);
    if (end == std::string::npos) end = t.size();
    const auto v = parse(std::string_view(t).substr(start, end - start));
    if (!v) return std::nullopt;
    out.push_back(static_cast<T>(*v));
    start = end + 1;
  }
  return out;
}

// The JSON form of `text` for `knob`; nullopt, with `expected` naming what was wanted, when it does not parse.
std::optional<nlohmann::json> to_json_value(const Knob& knob, std::string_view text, std::string& expected) {
  const std::string t = trim(text);
  switch (knob.type) {
    case KnobType::boolean:
      expected = "true or false";
      if (t == "true" || t == "1" || t == "yes" || t == "on") return true;
      if (t == "false" || t == "0" || t == "no" || t == "off") return false;
      return std::nullopt;
    case KnobType::integer:
      expected = "an integer";
      if (auto v = parse_integer(t)) return *v;
      return std::nullopt;
    case KnobType::number:
      expected = "a number";
      if (auto v = parse_number(t)) return *v;
      return std::nullopt;
    case KnobType::choice: {
      expected = alternatives(knob.choices);
      std::string v = t;
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      for (const auto& c : knob.choices)
        if (v == c) return v;
      return std::nullopt;
    }
    case KnobType::checkpointing: {
      expected = "none, all or increasing unit indices (1,3)";
      if (t == "none" || t == "all") return t;
      auto units = parse_list<int>(t, parse_integer);
      if (!units || units->empty()) return std::nullopt;
      for (std::size_t i = 1; i < units->size(); ++i)
        if ((*units)[i] <= (*units)[i - 1]) {
          expected = "unit indices strictly increasing (" + num((*units)[i - 1]) + " then " + num((*units)[i]) + ")";
          return std::nullopt;
        }
      return *units;
    }
    case KnobType::loss_scale:
      expected = "none, dynamic or a number";
      if (t == "none" || t == "dynamic") return t;
      if (auto v = parse_number(t)) return *v;
      return std::nullopt;
    case KnobType::balance: {
      expected = "time, memory or units per stage (3,5)";
      if (t == "time" || t == "memory") return t;
      auto units = parse_list<int>(t, parse_integer);
      if (!units || units->empty()) return std::nullopt;
      return *units;
    }
    case KnobType::number_pair: {
      expected = "two numbers (0.9,0.95)";
      auto v = parse_list<double>(t, parse_number);
      if (!v || v->size() != 2) return std::nullopt;
      return *v;
    }
  }
  return std::nullopt;
}

std::string_view type_name(KnobType t) {
  switch (t) {
    case KnobType::integer: return "integer";
    case KnobType::boolean: return "boolean";
    case KnobType::number: return "number";
    case KnobType::choice: return "string";
    case KnobType::checkpointing: return "checkpointing";
    case KnobType::loss_scale: return "loss_scale";
    case KnobType::number_pair: return "number[2]";
    case KnobType::balance: return "balance";
  }
  return "";
}

}  // namespace

void set_knob_text(Plan& plan, const Knob& knob, std::string_view text, std::string_view where) {
  const std::string what = std::string(where) + " " + knob.name + "=" + std::string(text);
  std::string expected;
  const auto value = to_json_value(knob, text, expected);
  if (!value) throw SchemaError(what + ": expected " + expected);
  knob.assign(plan, *value, what);
}

std::string_view support_name(Support s) {
  switch (s) {
    case Support::yes: return "yes";
    case Support::no: return "no";
    case Support::ignored: return "ignored";
  }
  return "";
}

nlohmann::ordered_json knob_table_json() {
  ojson rows = ojson::array();
  for (const Knob& k : knobs()) {
    ojson r;
    r["name"] = k.name;
    r["type"] = type_name(k.type);
    r["range"] = k.range;
    r["default"] = k.default_text;
    r["depends"] = k.dependent_default != nullptr;
    r["simulate"] = support_name(k.simulate);
    r["tune"] = support_name(k.tune);
    r["run"] = support_name(k.run);
    r["tune_knob"] = k.tune_knob;
    r["aliases"] = k.aliases;
    r["description"] = k.description;
    rows.push_back(std::move(r));
  }
  ojson dims = ojson::array();
  for (const TuneKnob& t : tune_knobs()) {
    ojson d;
    d["name"] = t.name;
    d["description"] = t.description;
    d["members"] = ojson::array();
    for (const Knob* k : tune_knob_members(t.name)) d["members"].push_back(k->name);
    dims.push_back(std::move(d));
  }
  ojson out;
  out["schema"] = "zeroplan.knobs/1";
  out["knobs"] = std::move(rows);
  out["tune_knobs"] = std::move(dims);
  ojson refusals = ojson::array();
  for (const RunRule& r : run_rules()) refusals.push_back({{"knobs", r.knobs}, {"refuses", r.refuses}});
  out["run_refuses"] = std::move(refusals);
  return out;
}

std::string knob_table_text() {
  const std::vector<std::string> head = {"name", "type", "range", "default", "simulate", "tune", "run", "tune --knobs",
                                         "description"};
  std::vector<std::vector<std::string>> rows = {head};
  for (const Knob& k : knobs())
    rows.push_back({k.name, std::string(type_name(k.type)), k.range.empty() ? "-" : k.range, k.default_text,
                    std::string(support_name(k.simulate)), std::string(support_name(k.tune)),
                    std::string(support_name(k.run)), k.tune_knob.empty() ? "-" : k.tune_knob, k.description});
  std::vector<std::size_t> width(head.size(), 0);
  for (const auto& r : rows)
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t c = 0; c < r.size(); ++c)
      line += c + 1 == r.size() ? r[c] : r[c] + std::string(width[c] - r[c].size() + 2, ' ');
    out += line + "\n";
  }
  out += "Defaults that name other knobs are dependent: a knob you do not set follows them. yes: honoured; no: a "
         "plan that uses it is rejected; ignored: accepted, no effect. tune --knobs: the search dimension that "
         "varies it.\n";
  out += "run also refuses (simulate and tune accept them; autopilot's tuner does not propose them):\n";
  for (const RunRule& r : run_rules()) {
    std::string knobs;
    for (const std::string& k : r.knobs) knobs += (knobs.empty() ? "" : ", ") + k;
    out += "  " + r.refuses + " [" + knobs + "]\n";
  }
  return out;
}

}  // namespace zeroplan
