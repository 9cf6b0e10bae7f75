// The checkpoint's files (checkpoint.cpp holds the piece that saves and loads them): atomic writes and a
// checked archive writer, the manifest's verification and the run's identity, and the folder's retention.
#include "checkpoint_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#include <c10/util/hash.h>

#include "strformat.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/exec/run.h"
#include "zeroplan/profiles/json_io.h"

namespace zeroplan::exec {

namespace fs = std::filesystem;

namespace checkpoint_files {

void sync_folder(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw ExecError(detail::format("checkpoint: cannot open {} to sync it", p.string()));
  ::fsync(fd);
  ::close(fd);
}

// Writes the archive to `tmp` through a checked writer. torch's save_to(filename) cannot fail cleanly: a
// write error (a full disk) throws inside its zip writer, whose destructor then throws again while
// unwinding and aborts the process. Here the writer records the first error and skips the rest, so the
// archive runs to its end and the error comes back as one line naming `file` (issue #37); the caller
// removes the temporary file.
void save_archive(torch::serialize::OutputArchive& ar, const fs::path& tmp, const fs::path& file) {
  std::FILE* out = std::fopen(tmp.c_str(), "wb");
  if (out == nullptr) throw ExecError(detail::format("checkpoint: cannot write {}: {}", file.string(), std::strerror(errno)));
  int error = 0;
  ar.save_to([&](const void* data, std::size_t n) -> std::size_t {
    if (error == 0 && n > 0 && std::fwrite(data, 1, n, out) != n) error = errno != 0 ? errno : EIO;
    return n;
  });
  if (error == 0 && std::fflush(out) != 0) error = errno;
  if (std::fclose(out) != 0 && error == 0) error = errno;
  if (error != 0) {
    throw ExecError(detail::format("checkpoint: cannot write {}: {} (the earlier checkpoints are kept)", file.string(),
                                   std::strerror(error)));
  }
}

fs::path step_dir(const std::string& dir, std::int64_t step) { return fs::path(dir) / ("step-" + std::to_string(step)); }

// A file's bytes and their SHA-1 (c10::sha1, as torch's own caches key their files).
std::pair<std::int64_t, std::string> file_digest(const fs::path& f) {
  std::ifstream in(f, std::ios::binary);
  if (!in) throw ExecError(detail::format("checkpoint: cannot read {}", f.string()));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  const std::string data = bytes.str();
  c10::sha1 hash(data);
  return {static_cast<std::int64_t>(data.size()), hash.str()};
}

// The run a checkpoint belongs to: its model, seed and global batch (the data order: step s trains the
// task's samples s x global_batch onwards, whatever the ranks and microbatches). The layout (stage, ranks,
// microbatches, offload) may change across a resume: that is resharding, recorded as the plan's SHA-1 only.
nlohmann::json run_identity(const Plan& plan, const std::string& model) {
  return {{"model", model}, {"seed", plan.seed}, {"global_batch", plan.global_batch}};
}

std::string other_run_refusal(const fs::path& sdir, const nlohmann::json& m, const Plan& plan, const std::string& model) {
  if (!m.contains("run") || !m["run"].is_object()) return "";
  const nlohmann::json& saved = m["run"];
  const nlohmann::json identity = run_identity(plan, model);
  std::string why;
  for (const auto& [key, now] : identity.items()) {
    if (key == "model" && model.empty()) continue;
    if (!saved.contains(key)) why = detail::format("its run identity has no \"{}\"", key);
    else if (saved[key] != now) why = detail::format("it is another run's: its {} {} != this run's {}", key, saved[key].dump(), now.dump());
    if (!why.empty()) break;
  }
  return why.empty() ? "" : detail::format("--resume {}: {} (resume it all the same with --resume-other-run)", sdir.string(), why);
}

// The manifest's values before any of them is used (a malformed one crashed the loader: shards 0 divided
// by zero, world_size 0 indexed nothing), then every rank file's size and SHA-1 where it recorded them.
void verify_manifest(const fs::path& sdir, const nlohmann::json& m, std::int64_t step) {
  auto bad = [&](const std::string& what) {
    return ExecError(detail::format("--resume {}: manifest.json {}", sdir.string(), what));
  };
  auto integer = [&](const char* key, std::int64_t lo, std::int64_t hi) {
    if (!m.contains(key) || !m[key].is_number_integer()) throw bad(detail::format("has no integer \"{}\"", key));
    const std::int64_t v = m[key].get<std::int64_t>();
    if (v < lo || v > hi) throw bad(detail::format("\"{}\" {} is not in {}..{}", key, v, lo, hi));
    return v;
  };
  const std::int64_t world = integer("world_size", 1, 1 << 20);
  integer("shards", 1, world);
  if (integer("step", 0, std::numeric_limits<std::int64_t>::max()) != step)
    throw bad(detail::format("says step {}, in the folder of step {}", m["step"].get<std::int64_t>(), step));
  integer("optimizer_steps", 0, std::numeric_limits<std::int64_t>::max());
  for (const char* key : {"param_dtype", "optimizer", "model"})
    if (!m.contains(key) || !m[key].is_string()) throw bad(detail::format("has no string \"{}\"", key));
  if (!m.contains("units") || !m["units"].is_array()) throw bad("has no \"units\" list");
  for (const auto& u : m["units"])
    if (!u.is_object() || !u.contains("name") || !u["name"].is_string() || !u.contains("numel") ||
        !u["numel"].is_number_integer() || u["numel"].get<std::int64_t>() < 0)
      throw bad("has a unit without a name and a parameter count");
  if (!m.contains("state_kinds") || !m["state_kinds"].is_array()) throw bad("has no \"state_kinds\" list");
  if (!m.contains("loss_scale") || !m["loss_scale"].is_number() || !(m["loss_scale"].get<double>() > 0))
    throw bad("has no positive \"loss_scale\"");
  integer("loss_scale_clean_steps", 0, std::numeric_limits<int>::max());
  if (!m.contains("master") || !m["master"].is_boolean()) throw bad("has no boolean \"master\"");
  for (const auto& k : m["state_kinds"])
    if (!k.is_string()) throw bad("has a state kind that is not a string");
  if (!m.contains("files")) return;  // an older checkpoint: no checksums recorded
  if (!m["files"].is_array() || static_cast<std::int64_t>(m["files"].size()) != world)
    throw bad(detail::format("lists {} files for {} ranks", m["files"].is_array() ? m["files"].size() : 0, world));
  for (std::int64_t r = 0; r < world; ++r) {
    const auto& f = m["files"][static_cast<std::size_t>(r)];
    const std::string name = "rank" + std::to_string(r) + ".pt";
    if (!f.is_object() || f.value("name", "") != name || !f.contains("bytes") || !f.contains("sha1"))
      throw bad(detail::format("files[{}] is not {{name: {}, bytes, sha1}}", r, name));
    if (!fs::exists(sdir / name)) throw ExecError(detail::format("--resume {}: {} is missing", sdir.string(), name));
    const auto [bytes, sha1] = file_digest(sdir / name);
    if (bytes != f["bytes"].get<std::int64_t>() || sha1 != f["sha1"].get<std::string>())
      throw ExecError(detail::format("--resume {}: {} is corrupted: {} bytes with SHA-1 {}, the manifest recorded {} "
                                     "bytes with SHA-1 {}", sdir.string(), name, bytes, sha1.substr(0, 12),
                                     f["bytes"].get<std::int64_t>(), f["sha1"].get<std::string>().substr(0, 12)));
  }
}

}  // namespace checkpoint_files

using namespace checkpoint_files;

std::int64_t newest_checkpoint(const std::string& dir) {
  std::int64_t best = -1;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return -1;
  const std::regex name("step-([0-9]{1,18})");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string base = e.path().filename().string();
    if (!std::regex_match(base, m, name) || !fs::exists(e.path() / "manifest.json")) continue;
    best = std::max<std::int64_t>(best, std::stoll(m[1].str()));
  }
  return best;
}

std::string other_run(const std::string& dir, const Plan& plan) {
  const std::int64_t step = newest_checkpoint(dir);
  if (step < 0) return "";
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(std::ifstream(step_dir(dir, step) / "manifest.json"));
  } catch (const std::exception&) {
    return "";  // the ranks' load names what is wrong with it
  }
  return other_run_refusal(step_dir(dir, step), m, plan, "");
}

std::vector<std::string> prune_checkpoints(const std::string& dir, std::int64_t newest, int keep) {
  std::error_code ec;
  std::vector<std::string> removed;
  if (!fs::is_directory(dir, ec)) return removed;
  const std::regex name("step-([0-9]{1,18})");
  std::vector<std::pair<std::int64_t, fs::path>> complete, partial;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string base = e.path().filename().string();
    if (!e.is_directory() || !std::regex_match(base, m, name)) continue;
    const std::int64_t step = std::stoll(m[1].str());
    (fs::exists(e.path() / "manifest.json") ? complete : partial).emplace_back(step, e.path());
  }
  std::sort(complete.begin(), complete.end());
  std::sort(partial.begin(), partial.end());
  std::vector<std::pair<std::int64_t, fs::path>> gone;
  for (const auto& p : partial)
    if (newest < 0 || p.first < newest) gone.push_back(p);
  if (keep > 0 && static_cast<int>(complete.size()) > keep)
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < complete.size(); ++i)
      if (complete[i].first != newest) gone.push_back(complete[i]);
  std::sort(gone.begin(), gone.end());
  for (const auto& [step, path] : gone) {
    // The manifest first: a folder half removed is never taken for a checkpoint.
    fs::remove(path / "manifest.json", ec);
    fs::remove_all(path, ec);
    if (ec) throw ExecError(detail::format("checkpoint: cannot remove {}: {}", path.string(), ec.message()));
    removed.push_back(path.string());
  }
  if (!removed.empty()) sync_folder(dir);
  return removed;
}

}  // namespace zeroplan::exec
