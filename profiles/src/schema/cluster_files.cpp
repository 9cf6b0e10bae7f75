// The cluster files: the shipped ones (profiles/data/clusters), this machine's probe (--cluster local),
// NAME[:NODES] and PATH[:NODES] specs, and "extends" (a file over another, its own numbers estimates
// unless it says where they came from).
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <set>

#include "cluster_internal.h"
#include "zeroplan/config.h"
#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/json_io.h"

namespace zeroplan {
namespace {

using detail::cluster_error;
constexpr int kMaxExtendsDepth = 8;

std::vector<std::string> shipped_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(shipped_clusters_dir(), ec))
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

[[noreturn]] void unknown_cluster(const std::string& name) {
  const std::vector<std::string> names = shipped_names();
  std::string message = "unknown cluster " + quote_json(name);
  const std::string guess = closest_match(name, names);
  if (!guess.empty()) message += " (did you mean " + quote_json(guess) + "?)";
  std::string all;
  for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
  message += "; shipped: " + (all.empty() ? "none in " + shipped_clusters_dir().string() : all) +
             "; or give a path to a .json file";
  cluster_error(message);
}

bool looks_like_path(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 5 && s.substr(s.size() - 5) == ".json");
}

std::filesystem::path shipped_cluster_file(const std::string& name) {
  std::filesystem::path file = shipped_clusters_dir() / (name + ".json");
  if (!std::filesystem::is_regular_file(file)) unknown_cluster(name);
  return file;
}
}  // namespace

nlohmann::json resolve_cluster_extends(const nlohmann::json& j, const std::filesystem::path& base_dir,
                                       const std::string& origin, int depth) {
  if (!j.is_object() || !j.contains("extends")) return j;
  if (depth >= kMaxExtendsDepth)
    cluster_error("\"extends\" nested deeper than " + num(kMaxExtendsDepth) + " (a cycle?) at " + origin);
  {
    // The extending document must itself be a cluster document.
    const auto it = j.find("schema");
    if (it == j.end() || !it->is_string() || it->get<std::string>() != kClusterSchema)
      cluster_error(it == j.end() ? std::string("missing \"schema\" (expected \"") + kClusterSchema + "\")"
                                  : "schema is " + describe(*it) + ", expected \"" + kClusterSchema + "\"");
  }
  const nlohmann::json& extends = j["extends"];
  if (!extends.is_string() || extends.get<std::string>().empty())
    cluster_error("extends: expected a cluster name or path, got " + describe(extends));
  const std::string spec = extends.get<std::string>();
  std::filesystem::path base_file;
  if (looks_like_path(spec)) {
    base_file = std::filesystem::path(spec);
    if (base_file.is_relative()) base_file = base_dir / base_file;
  } else {
    base_file = shipped_cluster_file(spec);
  }
  nlohmann::json base = parse_json_file(base_file);
  try {
    base = resolve_cluster_extends(base, base_file.parent_path(), base_file.string(), depth + 1);
  } catch (const SchemaError& e) {
    if (depth == 0) throw SchemaError(base_file.string() + ": " + e.what());
    throw;
  }
  if (!base.is_object()) cluster_error("extends " + quote_json(spec) + ": not a JSON object");

  nlohmann::json child = j;
  child.erase("extends");
  nlohmann::json merged = base;
  merged.merge_patch(child);

  // A number the extending document sets without saying where it came from is an estimate.
  const nlohmann::json child_provenance =
      child.contains("provenance") && child["provenance"].is_object() ? child["provenance"] : nlohmann::json::object();
  std::map<std::string, int> child_keys;
  for (auto it = child_provenance.begin(); it != child_provenance.end(); ++it) child_keys[it.key()] = 1;
  for (const std::string& path : detail::numeric_paths(child)) {
    if (detail::covered(child_keys, path)) continue;
    merged["provenance"][path] = {{"source", "estimate"},
                                  {"citation", "set in " + origin + " over " + spec + ", no source given"}};
  }
  // Entries of the base about fields the child replaced wholesale (arrays) may now dangle; drop those.
  if (merged.contains("provenance") && merged["provenance"].is_object()) {
    std::set<std::string> paths;
    detail::walk(merged, "", [&](const std::string& path, const nlohmann::json&) { paths.insert(path); });
    for (auto it = merged["provenance"].begin(); it != merged["provenance"].end();) {
      if (!paths.count(it.key()) && !child_keys.count(it.key()))
        it = merged["provenance"].erase(it);
      else
        ++it;
    }
  }
  if (!child.contains("name") && child.contains("nodes") && base.contains("name") && base["name"].is_string() &&
      merged["nodes"] != base["nodes"]) {
    std::string name = base["name"].get<std::string>();
    name = name.substr(0, name.find(':'));
    merged["name"] = name + ":" + merged["nodes"].dump();
  }
  return merged;
}

std::filesystem::path shipped_data_dir() {
  if (const char* dir = std::getenv("ZEROPLAN_DATA_DIR"); dir != nullptr && *dir != '\0')
    return std::filesystem::path(dir);
  return std::filesystem::path(ZEROPLAN_SOURCE_DIR) / "profiles" / "data";
}

std::filesystem::path shipped_clusters_dir() { return shipped_data_dir() / "clusters"; }

std::vector<ShippedCluster> list_shipped_clusters() {
  const std::filesystem::path dir = shipped_clusters_dir();
  if (!std::filesystem::is_directory(dir))
    cluster_error("no shipped cluster directory " + dir.string() + " (set ZEROPLAN_DATA_DIR)");
  std::vector<ShippedCluster> out;
  for (const std::string& name : shipped_names()) {
    ShippedCluster entry{name, ""};
    const nlohmann::json j = parse_json_file(dir / (name + ".json"));
    if (j.is_object() && j.contains("description") && j["description"].is_string())
      entry.description = j["description"].get<std::string>();
    out.push_back(std::move(entry));
  }
  return out;
}

std::filesystem::path local_probe_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::filesystem::path base =
      xdg != nullptr && *xdg ? std::filesystem::path(xdg) : std::filesystem::path(home != nullptr && *home ? home : "/tmp") / ".cache";
  char host[256] = "local";
  gethostname(host, sizeof host - 1);
  return base / "zeroplan" / ("probe-" + std::string(host) + ".json");
}

ClusterProfile resolve_cluster(std::string_view spec_view) {
  std::string spec(spec_view);
  int nodes = 0;
  const std::size_t colon = spec.rfind(':');
  if (colon != std::string::npos) {
    const std::string count = spec.substr(colon + 1);
    if (count.empty() || !std::all_of(count.begin(), count.end(), [](unsigned char ch) { return std::isdigit(ch); }))
      cluster_error("bad cluster spec " + quote_json(spec) + ": expected NAME, PATH, NAME:NODES or PATH:NODES");
    if (count.size() > 6 || std::stoi(count) < 1)
      cluster_error("bad cluster spec " + quote_json(spec) + ": node count " + count + " must be in 1..999999");
    nodes = std::stoi(count);
    spec = spec.substr(0, colon);
  }
  if (spec.empty()) cluster_error("empty cluster spec");
  std::filesystem::path file;
  if (spec == "local") {
    file = local_probe_path();
    if (!std::filesystem::exists(file))
      cluster_error("cluster local: no probe of this machine at " + file.string() +
                    "; run `zeroplan probe` (or `zeroplan autopilot`) first");
  } else {
    file = looks_like_path(spec) ? std::filesystem::path(spec) : shipped_cluster_file(spec);
  }
  ClusterProfile c = read_document<ClusterProfile>(file);
  if (nodes > 0) {
    c.nodes = nodes;
    c.name = c.name.substr(0, c.name.find(':')) + ":" + std::to_string(nodes);
    validate(c);
  }
  return c;
}

}  // namespace zeroplan
