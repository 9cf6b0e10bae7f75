// Private helpers for strict reading and ordered writing of the documents.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "zeroplan/profiles/errors.h"

namespace zeroplan {

using ojson = nlohmann::ordered_json;

// Throws SchemaError("PATH: MESSAGE").
[[noreturn]] void fail(const std::string& path, const std::string& message);

// Levenshtein distance, for did-you-mean.
std::size_t edit_distance(std::string_view a, std::string_view b);
// The closest candidate within a distance of max(2, len/3), or "".
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

// "string \"x\"", "number 3", "object", ... for type errors.
std::string describe(const nlohmann::json& j);

// A number formatted like JSON writes it (shortest round-trip), for messages.
std::string num(double v);
std::string num(std::int64_t v);
inline std::string num(int v) { return num(static_cast<std::int64_t>(v)); }
std::string quote_json(std::string_view s);

// Recursive copy between the ordered (writing) and plain (nlohmann ADL) JSON types.
nlohmann::json to_plain(const ojson& j);
ojson to_ordered(const nlohmann::json& j);

// Scalar and container readers; each throws SchemaError naming `path`.
void read_value(const nlohmann::json& j, bool& out, const std::string& path);
void read_value(const nlohmann::json& j, int& out, const std::string& path);
void read_value(const nlohmann::json& j, std::int64_t& out, const std::string& path);
void read_value(const nlohmann::json& j, std::uint64_t& out, const std::string& path);
void read_value(const nlohmann::json& j, double& out, const std::string& path);
void read_value(const nlohmann::json& j, std::string& out, const std::string& path);

// (Before the vector reader, which reads arrays of arrays through it.)
template <class T, std::size_t N>
void read_value(const nlohmann::json& j, std::array<T, N>& out, const std::string& path) {
  if (!j.is_array() || j.size() != N)
    fail(path, "expected an array of " + std::to_string(N) + ", got " + describe(j));
  for (std::size_t i = 0; i < N; ++i) read_value(j[i], out[i], path + "[" + std::to_string(i) + "]");
}

template <class T>
void read_value(const nlohmann::json& j, std::vector<T>& out, const std::string& path) {
  if (!j.is_array()) fail(path, "expected an array, got " + describe(j));
  out.clear();
  out.resize(j.size());
  for (std::size_t i = 0; i < j.size(); ++i) read_value(j[i], out[i], path + "[" + std::to_string(i) + "]");
}

template <class T>
void read_value(const nlohmann::json& j, std::map<std::string, T>& out, const std::string& path) {
  if (!j.is_object()) fail(path, "expected an object, got " + describe(j));
  out.clear();
  for (auto it = j.begin(); it != j.end(); ++it) read_value(it.value(), out[it.key()], path + "." + it.key());
}

// Reads the keys of one JSON object strictly: every key must be taken by req()/opt(), required keys
// must be present. finish() reports unknown keys first (with did-you-mean), then missing ones.
class ObjectReader {
 public:
  ObjectReader(const nlohmann::json& j, std::string path);

  template <class T>
  void req(const char* key, T& out) {
    if (const nlohmann::json* v = take(key, true)) read_value(*v, out, sub(key));
  }
  template <class T>
  void opt(const char* key, T& out) {
    if (const nlohmann::json* v = take(key, false)) read_value(*v, out, sub(key));
  }
  // Marks `key` as known; returns it or nullptr. Required keys that are absent are remembered.
  const nlohmann::json* take(const char* key, bool required);
  bool has(const char* key) const { return j_.contains(key); }
  std::string sub(const char* key) const;
  const std::string& path() const { return path_; }
  void finish();

 private:
  const nlohmann::json& j_;
  std::string path_;
  std::vector<std::string> known_;
  std::vector<std::string> missing_;
};

// Checks the "schema" key of a document against `expected` ("zeroplan.plan/1").
void check_schema(ObjectReader& r, const char* expected);

// Vectors and maps of documents' sub-structures for writing.
template <class T, class F>
ojson write_array(const std::vector<T>& v, F&& write_one) {
  ojson a = ojson::array();
  for (const T& x : v) a.push_back(write_one(x));
  return a;
}

// Each document in key order for writing (defined beside its from_json).
struct ModelProfile;
struct ClusterProfile;
struct Plan;
struct Prediction;
struct RunRecord;
struct Comparison;
ojson to_ordered_json(const ModelProfile& document);
ojson to_ordered_json(const ClusterProfile& document);
ojson to_ordered_json(const Plan& document);
ojson to_ordered_json(const Prediction& document);
ojson to_ordered_json(const RunRecord& document);
ojson to_ordered_json(const Comparison& document);

// Parses a JSON file; SchemaError "FILE: cannot open" / "FILE:LINE:COL: invalid JSON: ..." (json_io.cpp).
nlohmann::json parse_json_file(const std::filesystem::path& file);
nlohmann::json parse_json_text(const std::string& text, const std::string& origin);

// Replaces a cluster document's "extends" by the merged base, recursively (cluster.cpp). Relative base
// paths are relative to `base_dir`; `origin` names the extending document in provenance citations.
nlohmann::json resolve_cluster_extends(const nlohmann::json& j, const std::filesystem::path& base_dir,
                                       const std::string& origin, int depth = 0);
// Reads a cluster document that has no "extends" (cluster.cpp); validates.
void read_resolved_cluster(const nlohmann::json& j, ClusterProfile& cluster);

// A Plan nested in another document (Prediction, RunRecord); validates it.
void read_value(const nlohmann::json& j, Plan& plan, const std::string& path);
// Plan fields with a JSON form of their own (plan.cpp); the knob registry sets them too.
struct Checkpointing;
struct LossScale;
void read_value(const nlohmann::json& j, Checkpointing& c, const std::string& path);
void read_value(const nlohmann::json& j, LossScale& s, const std::string& path);
struct PipelineBalance;
void read_value(const nlohmann::json& j, PipelineBalance& b, const std::string& path);

}  // namespace zeroplan
