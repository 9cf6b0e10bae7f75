// The checkpoint's files (checkpoint_files.cpp): what the Checkpoint piece (checkpoint.cpp) writes and
// checks, apart from the states themselves.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include <torch/serialize/output-archive.h>

#include "strformat.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/profiles/plan.h"

namespace zeroplan::exec::checkpoint_files {

inline constexpr const char* kManifestSchema = "zeroplan.checkpoint/1";

// fsync of a folder (a rename or removal in it on disk). Throws ExecError when it cannot be opened.
void sync_folder(const std::filesystem::path& p);

// Writes `path` atomically (profiles' write_file_atomically: a temporary file, synced, renamed, the folder
// synced): `contents` is the bytes, or fill(tmp) writing the temporary file.
template <typename Contents>
void write_atomically(const std::filesystem::path& path, const Contents& contents) {
  try {
    write_file_atomically(path, path, contents);
  } catch (const SchemaError& e) {
    throw ExecError(detail::format("checkpoint: {}", e.what()));
  }
}

// Writes the archive to `tmp` through a checked writer; a write error (a full disk) is one ExecError naming
// `file`. The caller removes the temporary file.
void save_archive(torch::serialize::OutputArchive& ar, const std::filesystem::path& tmp, const std::filesystem::path& file);

// dir/step-<step>.
std::filesystem::path step_dir(const std::string& dir, std::int64_t step);

// A file's bytes and their SHA-1 (c10::sha1).
std::pair<std::int64_t, std::string> file_digest(const std::filesystem::path& f);

// The run a checkpoint belongs to: its model, seed and global batch (the data order).
nlohmann::json run_identity(const Plan& plan, const std::string& model);
// One line refusing the manifest `m` of folder `sdir` as another run's than (plan, model), naming the first
// identity field that differs; "" when none does or the manifest predates run identities. An empty `model`
// is not compared (the launcher checks before the model is built; the ranks compare it).
std::string other_run_refusal(const std::filesystem::path& sdir, const nlohmann::json& m, const Plan& plan,
                              const std::string& model);

// The manifest's values in range, then every rank file's size and SHA-1 where it recorded them. Throws
// ExecError in one line naming the file.
void verify_manifest(const std::filesystem::path& sdir, const nlohmann::json& m, std::int64_t step);

}  // namespace zeroplan::exec::checkpoint_files
