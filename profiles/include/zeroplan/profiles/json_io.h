// Reading and writing the six documents as files and strings.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/comparison.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/model_profile.h"
#include "zeroplan/profiles/plan.h"
#include "zeroplan/profiles/prediction.h"
#include "zeroplan/profiles/run_record.h"

namespace zeroplan {

// T is one of ModelProfile, ClusterProfile, Plan, Prediction, RunRecord, Comparison (explicitly
// instantiated in json_io.cpp).

// Parses, checks the schema string and keys strictly, and validates. Throws SchemaError whose message
// starts with the file name: "FILE: cannot open", "FILE:3:14: invalid JSON: ...", "FILE: plan: ...".
// A ClusterProfile's "extends" path is relative to FILE's directory.
template <class T>
T read_document(const std::filesystem::path& file);

// Same from text; `origin` names the source in messages (a file name, "<stdin>").
template <class T>
T parse_document(const std::string& text, const std::string& origin = "<string>");

// The document as JSON text: 2-space indentation, keys in schema order, trailing newline.
// Doubles are written with the shortest representation that reads back to the same value.
template <class T>
std::string to_json_string(const T& document);

// Validates, then writes to_json_string(document). A regular file (or a new one) is replaced atomically:
// a temporary file in the same directory, flushed and synced, then renamed over it. A symlink is
// followed (the link stays a link); a device or a pipe is written in place, never replaced. Throws
// SchemaError ("FILE: cannot write: reason") on I/O failure.
template <class T>
void write_document(const std::filesystem::path& file, const T& document);

// Before any work: throws SchemaError (one line) when `file` cannot be written as write_document would
// write it: an empty path, a directory, a missing or read-only folder, a device or pipe not writable.
void check_output(const std::filesystem::path& file);

// The path written for `file`: symlinks resolved, a missing tail kept.
std::filesystem::path output_target(const std::filesystem::path& file);

// The atomic replacement write_document does for a regular file `target` (named `file` in errors), and
// checkpoints for their files: `fill(temp)` writes a temporary file beside `target`, which is synced to
// disk and renamed over it, then the folder is synced. Throws SchemaError ("FILE: cannot write: reason");
// what `fill` throws passes through, the temporary file removed.
void write_file_atomically(const std::filesystem::path& file, const std::filesystem::path& target,
                           const std::function<void(const std::filesystem::path& temp)>& fill);
// The same with `bytes` as the file's contents.
void write_file_atomically(const std::filesystem::path& file, const std::filesystem::path& target,
                           std::string_view bytes);

// The "schema" string of a JSON document, or "" if it has none (to dispatch on an unknown file).
std::string schema_of(const nlohmann::json& j);

}  // namespace zeroplan
