// Private to the ClusterProfile schema (cluster.cpp reads and writes it, cluster_validate.cpp checks it,
// cluster_files.cpp finds and resolves the files): its error and the numeric paths that need provenance.
#pragma once

#include <string>
#include <vector>

#include "json_util.h"

namespace zeroplan::detail {

inline constexpr const char* kClusterWhere = "cluster";

[[noreturn]] inline void cluster_error(const std::string& message) { fail(kClusterWhere, message); }

// Every node of a JSON tree by path ("device.peak_flops.fp32", "collectives[0].world_sizes[1]"),
// calling `leaf` for numbers and `node` for every node.
template <class Json, class NodeFn>
void walk(const Json& j, const std::string& path, NodeFn&& node) {
  node(path, j);
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      walk(it.value(), path.empty() ? it.key() : path + "." + it.key(), node);
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) walk(j[i], path + "[" + std::to_string(i) + "]", node);
  }
}

// Keys of the cluster document that carry no numbers needing provenance.
inline bool outside_provenance(const std::string& top_key) {
  return top_key == "schema" || top_key == "name" || top_key == "description" || top_key == "provenance" ||
         top_key == "extends" || top_key == "nodes";
}

inline std::string top_key_of(const std::string& path) { return path.substr(0, path.find_first_of(".[")); }

// True when `provenance` has `path` or an ancestor of it.
template <class Map>
bool covered(const Map& provenance, const std::string& path) {
  for (std::size_t end = path.size();;) {
    if (provenance.count(path.substr(0, end))) return true;
    const std::size_t cut = path.find_last_of(".[", end - 1);
    if (cut == std::string::npos || cut == 0) return false;
    end = cut;
  }
}

// Numeric leaf paths of a cluster document that need provenance.
template <class Json>
std::vector<std::string> numeric_paths(const Json& j) {
  std::vector<std::string> out;
  walk(j, "", [&](const std::string& path, const Json& v) {
    if (!path.empty() && v.is_number() && !outside_provenance(top_key_of(path))) out.push_back(path);
  });
  return out;
}

}  // namespace zeroplan::detail
