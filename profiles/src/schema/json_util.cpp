#include "json_util.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace zeroplan {

void fail(const std::string& path, const std::string& message) {
  throw SchemaError(path.empty() ? message : path + ": " + message);
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  const std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  std::string best;
  std::size_t best_distance = limit + 1;
  for (const std::string& c : candidates) {
    const std::size_t d = edit_distance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

std::string quote_json(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

std::string describe(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return "boolean " + j.dump();
    case nlohmann::json::value_t::string: {
      std::string s = j.get<std::string>();
      if (s.size() > 40) s = s.substr(0, 37) + "...";
      return "string " + quote_json(s);
    }
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
    case nlohmann::json::value_t::number_float: return "number " + j.dump();
    case nlohmann::json::value_t::object: return "object";
    case nlohmann::json::value_t::array: return "array";
    default: return "value";
  }
}

std::string num(double v) { return nlohmann::json(v).dump(); }
std::string num(std::int64_t v) { return std::to_string(v); }

nlohmann::json to_plain(const ojson& j) {
  if (j.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto it = j.begin(); it != j.end(); ++it) out[it.key()] = to_plain(it.value());
    return out;
  }
  if (j.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& x : j) out.push_back(to_plain(x));
    return out;
  }
  switch (j.type()) {
    case ojson::value_t::null: return nullptr;
    case ojson::value_t::boolean: return j.get<bool>();
    case ojson::value_t::string: return j.get<std::string>();
    case ojson::value_t::number_integer: return j.get<std::int64_t>();
    case ojson::value_t::number_unsigned: return j.get<std::uint64_t>();
    case ojson::value_t::number_float: return j.get<double>();
    default: return nullptr;
  }
}

ojson to_ordered(const nlohmann::json& j) {
  if (j.is_object()) {
    ojson out = ojson::object();
    for (auto it = j.begin(); it != j.end(); ++it) out[it.key()] = to_ordered(it.value());
    return out;
  }
  if (j.is_array()) {
    ojson out = ojson::array();
    for (const auto& x : j) out.push_back(to_ordered(x));
    return out;
  }
  switch (j.type()) {
    case nlohmann::json::value_t::null: return nullptr;
    case nlohmann::json::value_t::boolean: return j.get<bool>();
    case nlohmann::json::value_t::string: return j.get<std::string>();
    case nlohmann::json::value_t::number_integer: return j.get<std::int64_t>();
    case nlohmann::json::value_t::number_unsigned: return j.get<std::uint64_t>();
    case nlohmann::json::value_t::number_float: return j.get<double>();
    default: return nullptr;
  }
}

void read_value(const nlohmann::json& j, bool& out, const std::string& path) {
  if (!j.is_boolean()) fail(path, "expected true or false, got " + describe(j));
  out = j.get<bool>();
}

void read_value(const nlohmann::json& j, std::int64_t& out, const std::string& path) {
  if (j.is_number_unsigned()) {
    const auto u = j.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      fail(path, "integer " + j.dump() + " is out of range");
    out = static_cast<std::int64_t>(u);
    return;
  }
  if (j.is_number_integer()) {
    out = j.get<std::int64_t>();
    return;
  }
  if (j.is_number_float()) {
    // 8e10 written in exponent form is still an integer; 1.5 is not.
    const double d = j.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e18) {
      out = static_cast<std::int64_t>(d);
      return;
    }
  }
  fail(path, "expected an integer, got " + describe(j));
}

void read_value(const nlohmann::json& j, int& out, const std::string& path) {
  std::int64_t v = 0;
  read_value(j, v, path);
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    fail(path, "integer " + std::to_string(v) + " is out of range");
  out = static_cast<int>(v);
}

void read_value(const nlohmann::json& j, std::uint64_t& out, const std::string& path) {
  if (j.is_number_unsigned()) {
    out = j.get<std::uint64_t>();
    return;
  }
  std::int64_t v = 0;
  read_value(j, v, path);
  if (v < 0) fail(path, "expected a non-negative integer, got " + describe(j));
  out = static_cast<std::uint64_t>(v);
}

void read_value(const nlohmann::json& j, double& out, const std::string& path) {
  if (!j.is_number()) fail(path, "expected a number, got " + describe(j));
  out = j.get<double>();
}

void read_value(const nlohmann::json& j, std::string& out, const std::string& path) {
  if (!j.is_string()) fail(path, "expected a string, got " + describe(j));
  out = j.get<std::string>();
}

ObjectReader::ObjectReader(const nlohmann::json& j, std::string path) : j_(j), path_(std::move(path)) {
  if (!j_.is_object()) fail(path_, "expected an object, got " + describe(j_));
}

const nlohmann::json* ObjectReader::take(const char* key, bool required) {
  known_.emplace_back(key);
  auto it = j_.find(key);
  if (it == j_.end()) {
    if (required) missing_.emplace_back(key);
    return nullptr;
  }
  return &*it;
}

std::string ObjectReader::sub(const char* key) const { return path_ + "." + key; }

void ObjectReader::finish() {
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    if (std::find(known_.begin(), known_.end(), it.key()) != known_.end()) continue;
    std::string message = "unknown key " + quote_json(it.key());
    const std::string guess = closest_match(it.key(), known_);
    if (!guess.empty()) message += " (did you mean " + quote_json(guess) + "?)";
    fail(path_, message);
  }
  if (!missing_.empty()) {
    std::string message = missing_.size() == 1 ? "missing required key " : "missing required keys ";
    for (std::size_t i = 0; i < missing_.size(); ++i) message += (i ? ", " : "") + quote_json(missing_[i]);
    fail(path_, message);
  }
}

void check_schema(ObjectReader& r, const char* expected) {
  const nlohmann::json* s = r.take("schema", false);
  if (s == nullptr) fail(r.path(), std::string("missing \"schema\" (expected \"") + expected + "\")");
  if (!s->is_string() || s->get<std::string>() != expected)
    fail(r.path(), "schema is " + describe(*s) + ", expected \"" + expected + "\"");
}

}  // namespace zeroplan
