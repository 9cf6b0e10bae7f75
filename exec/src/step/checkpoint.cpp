// Checkpoint and resume, sharded as DeepSpeed's save_checkpoint and FSDP's sharded state dict are: every
// rank writes what it owns, and a checkpoint exists exactly when its manifest does.
//   <dir>/step-<N>/rank<r>.pt      this rank's shard: parameters (its chunk of every unit; the whole model
//                                  at stage 0), the fp32 master and the optimizer state in the same layout,
//                                  the RNG state, the module buffers (BatchNorm statistics)
//   <dir>/step-<N>/manifest.json   written by rank 0 after every rank's file is in place: the step, the
//                                  ranks, the layout, the units, the loss scale, and each rank file's
//                                  size and SHA-1 (c10::sha1); each file also names its step and rank
// Loading verifies before it uses anything: the manifest's values (ranks, shards, units) in range, every
// file's size and SHA-1 as the manifest recorded them, and the step and rank each file names, so a
// flipped byte, a NaN written over a value, two shards swapped or a shard of another step is refused in
// one line naming the file (issue #37).
// Each file is written to a temporary name in its folder, flushed to disk and renamed; a previous
// manifest of the same step is removed before any rank writes. A rank killed in the middle of a save
// leaves that step without a manifest and every earlier checkpoint whole.
// Loading reshards: the layout (units in order, each split in `shards` equal chunks, padded) does not
// depend on the world size, so a rank reassembles each unit from the old chunks and takes its own.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include <c10/util/hash.h>

#include "checkpoint_files.h"
#include "pieces.h"
#include "strformat.h"
#include "zeroplan/exec/exec_errors.h"
#include "zeroplan/exec/run.h"
#include "zeroplan/profiles/json_io.h"

namespace zeroplan::exec {

namespace fs = std::filesystem;
using namespace checkpoint_files;

namespace {

// The element layout of one kind (parameters, master, each optimizer state) in a rank's file: units in
// order, each this rank's chunk of ceil(numel / shards) elements (the whole unit when shards is 1).
std::int64_t chunk_of(std::int64_t numel, int shards) { return (numel + shards - 1) / shards; }

// The manifest `m` of step `step` in `sdir` checked against this run before anything is read: its schema
// and values (verify_manifest), the run's identity unless `other_run`, the parameter dtype, the optimizer
// every unit's name and size, and the optimizer's state kinds. Throws ExecError naming both sides.
void check_compatible(const nlohmann::json& m, const fs::path& sdir, std::int64_t step, const pieces::Ctx& c, bool other_run,
                      const std::vector<std::string>& state_kinds) {
  auto mismatch = [&](const std::string& what, const std::string& saved, const std::string& now) {
    return ExecError(detail::format("--resume {}: the checkpoint's {} {} != this run's {}", sdir.string(), what, saved, now));
  };
  if (m.value("schema", "") != kManifestSchema) throw mismatch("schema", m.value("schema", "?"), kManifestSchema);
  verify_manifest(sdir, m, step);
  if (!other_run) {
    if (const std::string refusal = other_run_refusal(sdir, m, c.plan, c.model.name); !refusal.empty()) throw ExecError(refusal);
  }
  if (m.at("param_dtype").get<std::string>() != c.plan.precision.param_dtype)
    throw mismatch("param_dtype", m.at("param_dtype").get<std::string>(), c.plan.precision.param_dtype);
  if (m.at("optimizer").get<std::string>() != c.plan.optimizer.name)
    throw mismatch("optimizer", m.at("optimizer").get<std::string>(), c.plan.optimizer.name);
  const auto& units = m.at("units");
  if (units.size() != c.units.size())
    throw mismatch("unit count", std::to_string(units.size()), std::to_string(c.units.size()));
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::string name = units[u].at("name");
    const std::int64_t numel = units[u].at("numel");
    if (name != c.units[u].name || numel != c.units[u].numel())
      throw mismatch(detail::format("unit {}", u), detail::format("{} ({} parameters)", name, numel),
                     detail::format("{} ({} parameters)", c.units[u].name, c.units[u].numel()));
  }
  if (m.at("state_kinds").get<std::vector<std::string>>() != state_kinds)
    throw mismatch("optimizer state", m.at("state_kinds").dump(), nlohmann::json(state_kinds).dump());
}

// The old run's rank files, each checked to name this step and its rank: a shard of another step or rank
// is refused even where the manifest (an older one, without checksums) could not tell.
std::vector<torch::serialize::InputArchive> open_rank_files(const fs::path& sdir, std::int64_t step, int old_world) {
  std::vector<torch::serialize::InputArchive> files(static_cast<std::size_t>(old_world));
  for (int r = 0; r < old_world; ++r) {
    const fs::path f = sdir / ("rank" + std::to_string(r) + ".pt");
    try {
      files[static_cast<std::size_t>(r)].load_from(f.string());
    } catch (const std::exception&) {
      throw ExecError(detail::format("--resume {}: {} is missing or unreadable", sdir.string(), f.filename().string()));
    }
    torch::Tensor id;
    if (files[static_cast<std::size_t>(r)].try_read("identity", id)) {
      if (id.numel() != 3 || id[0].item<std::int64_t>() != step || id[1].item<std::int64_t>() != r)
        throw ExecError(detail::format("--resume {}: {} holds step {} rank {}, not step {} rank {}", sdir.string(),
                                       f.filename().string(), id.numel() == 3 ? id[0].item<std::int64_t>() : -1,
                                       id.numel() == 3 ? id[1].item<std::int64_t>() : -1, step, r));
    }
  }
  return files;
}

}  // namespace


namespace pieces {

Checkpoint::Checkpoint(Ctx& c, ParamResidency& params, OptimizerStep& opt, Precision& precision)
    : c_(c), params_(params), opt_(opt), precision_(precision) {}

int Checkpoint::shards() const { return c_.plan.zero_stage >= 1 ? c_.world : 1; }

// This rank's parameters in the checkpoint layout (a copy).
torch::Tensor Checkpoint::owned_params() {
  if (params_.sharded()) return params_.flat().clone();
  if (shards() == 1) return params_.flat().clone();
  std::vector<torch::Tensor> parts;
  for (int u = 0; u < c_.unit_count(); ++u) parts.push_back(params_.chunk(u));
  return torch::cat(parts).to(torch::kCPU);
}

void Checkpoint::save(const std::string& dir, std::int64_t step) {
  torch::NoGradGuard no_grad;
  c_.at("all", "checkpoint");
  const fs::path sdir = step_dir(dir, step);
  // The step's previous manifest goes before any rank writes: the folder is not a checkpoint meanwhile.
  c_.comm.barrier();
  if (c_.rank == 0) {
    std::error_code ec;
    fs::create_directories(sdir, ec);
    if (ec) throw ExecError(detail::format("checkpoint: cannot create {}: {}", sdir.string(), ec.message()));
    if (fs::remove(sdir / "manifest.json", ec)) sync_folder(sdir);
  }
  c_.comm.barrier();
  torch::serialize::OutputArchive ar;
  ar.write("params", owned_params().to(torch::kCPU));
  if (opt_.master().defined()) ar.write("master", opt_.master().to(torch::kCPU));
  const std::vector<std::string> kinds = opt_.optimizer().state_kinds();
  for (std::size_t k = 0; k < kinds.size(); ++k) ar.write("state_" + kinds[k], opt_.optimizer().state(k).to(torch::kCPU));
  ar.write("rng", c_.dev.rng_state().to(torch::kCPU));
  ar.write("identity", torch::tensor({step, static_cast<std::int64_t>(c_.rank), static_cast<std::int64_t>(c_.world)}));
  for (int u = 0; u < c_.unit_count(); ++u) {
    std::size_t b = 0;
    for (const auto& buf : c_.unit(u).module->buffers()) {
      ar.write("buffer_" + std::to_string(u) + "_" + std::to_string(b++), buf.detach().to(torch::kCPU));
    }
  }
  const fs::path shard = sdir / ("rank" + std::to_string(c_.rank) + ".pt");
  write_atomically(shard, [&](const fs::path& tmp) {
    save_archive(ar, tmp, shard);
    // Fault injection for the kill-safety test: the last rank dies with its shard half saved.
    if (const char* kill = std::getenv("ZEROPLAN_FAULT_KILL_IN_SAVE");
        kill != nullptr && std::atoll(kill) == step && c_.rank == c_.world - 1) {
      std::_Exit(137);
    }
  });
  c_.comm.barrier();  // every rank's file is in place
  if (c_.rank != 0) return;
  nlohmann::json m;
  m["schema"] = kManifestSchema;
  m["step"] = step;
  m["world_size"] = c_.world;
  m["shards"] = shards();
  m["zero_stage"] = c_.plan.zero_stage;
  m["model"] = c_.model.name;
  m["run"] = run_identity(c_.plan, c_.model.name);
  m["plan_sha1"] = c10::sha1(to_json_string(c_.plan)).str();
  m["param_dtype"] = c_.plan.precision.param_dtype;
  m["optimizer"] = c_.plan.optimizer.name;
  m["optimizer_steps"] = opt_.optimizer().steps();
  m["state_kinds"] = kinds;
  m["master"] = opt_.master().defined();
  m["loss_scale"] = precision_.scaler().scale();
  m["loss_scale_clean_steps"] = precision_.scaler().clean_steps();
  for (const UnitRT& U : c_.units) m["units"].push_back({{"name", U.name}, {"numel", U.numel()}});
  // Every rank's file is in place (the barrier above): its size and SHA-1, checked before a resume uses it.
  for (int r = 0; r < c_.world; ++r) {
    const auto [bytes, sha1] = file_digest(sdir / ("rank" + std::to_string(r) + ".pt"));
    m["files"].push_back({{"name", "rank" + std::to_string(r) + ".pt"}, {"bytes", bytes}, {"sha1", sha1}});
  }
  write_atomically(sdir / "manifest.json", m.dump(1) + "\n");
}

std::int64_t Checkpoint::load(const std::string& dir, bool other_run) {
  torch::NoGradGuard no_grad;
  c_.at("all", "resume");
  const std::int64_t step = newest_checkpoint(dir);
  if (step < 0) throw ExecError(detail::format("--resume {}: no checkpoint there (no step-<N>/manifest.json)", dir));
  const fs::path sdir = step_dir(dir, step);
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(std::ifstream(sdir / "manifest.json"));
  } catch (const std::exception& e) {
    throw ExecError(detail::format("--resume {}: manifest unreadable: {}", sdir.string(), e.what()));
  }
  const std::vector<std::string> kinds = opt_.optimizer().state_kinds();
  check_compatible(m, sdir, step, c_, other_run, kinds);
  const int old_world = m.at("world_size"), old_shards = m.at("shards");
  std::vector<torch::serialize::InputArchive> files = open_rank_files(sdir, step, old_world);
  auto read = [&](int r, const std::string& key) {
    torch::Tensor t;
    if (!files[static_cast<std::size_t>(r)].try_read(key, t))
      throw ExecError(detail::format("--resume {}: rank{}.pt has no '{}'", sdir.string(), r, key));
    return t;
  };
  // Unit u of `key`, whole (numel elements), from the old ranks' chunks.
  auto whole = [&](const std::string& key) {
    std::vector<torch::Tensor> per_rank;
    for (int r = 0; r < old_shards; ++r) per_rank.push_back(read(r, key));
    std::vector<torch::Tensor> out;
    std::int64_t base = 0;
    for (const UnitRT& U : c_.units) {
      const std::int64_t chunk = chunk_of(U.numel(), old_shards);
      std::vector<torch::Tensor> parts;
      for (int r = 0; r < old_shards; ++r) parts.push_back(per_rank[static_cast<std::size_t>(r)].narrow(0, base, chunk));
      out.push_back(torch::cat(parts).narrow(0, 0, U.numel()));
      base += chunk;
    }
    return out;
  };
  // This rank's chunk of unit u (padded with zeros) in this run's layout.
  auto mine = [&](const torch::Tensor& unit_whole, const UnitRT& U) {
    const std::int64_t chunk = U.shard();
    torch::Tensor padded = torch::zeros({chunk * shards()}, unit_whole.options());
    padded.narrow(0, 0, U.numel()).copy_(unit_whole);
    return padded.narrow(0, U.layout.shard_begin(shards() > 1 ? c_.rank : 0), chunk);
  };

  const std::vector<torch::Tensor> params = whole("params");
  for (int u = 0; u < c_.unit_count(); ++u) {
    const UnitRT& U = c_.unit(u);
    if (params_.sharded()) {
      params_.flat().narrow(0, U.shard_base, U.shard()).copy_(mine(params[static_cast<std::size_t>(u)], U));
    } else {
      params_.flat().narrow(0, U.base, U.numel()).copy_(params[static_cast<std::size_t>(u)]);
    }
  }
  // Where the optimizer keeps a shard-layout copy (master, states): this rank's chunks, concatenated.
  auto fill = [&](torch::Tensor dst, const std::vector<torch::Tensor>& units_whole) {
    for (int u = 0; u < c_.unit_count(); ++u) {
      const UnitRT& U = c_.unit(u);
      dst.narrow(0, U.shard_base, U.shard()).copy_(mine(units_whole[static_cast<std::size_t>(u)], U));
    }
  };
  if (opt_.master().defined()) {
    if (!m.at("master").get<bool>()) {
      // A master is this run's copy of the parameters (offloaded optimizer): rebuilt from them.
      std::vector<torch::Tensor> p32;
      for (const auto& t : params) p32.push_back(t.to(opt_.master().scalar_type()));
      fill(opt_.master(), p32);
    } else {
      fill(opt_.master(), whole("master"));
    }
  }
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    torch::Tensor flat = torch::zeros({c_.shard_total}, opt_.optimizer().state(k).options().device(torch::kCPU));
    fill(flat, whole("state_" + kinds[k]));
    opt_.optimizer().set_state(k, flat);
  }
  opt_.optimizer().set_steps(m.at("optimizer_steps").get<std::int64_t>());
  // Per-rank state: this rank's own, or the first rank's when the old run had fewer ranks.
  const int from = c_.rank < old_world ? c_.rank : 0;
  c_.dev.set_rng_state(read(from, "rng"));
  for (int u = 0; u < c_.unit_count(); ++u) {
    std::size_t b = 0;
    for (auto& buf : c_.unit(u).module->buffers()) {
      buf.copy_(read(from, "buffer_" + std::to_string(u) + "_" + std::to_string(b++)));
    }
  }
  precision_.scaler().load_state(m.at("loss_scale").get<double>(), m.at("loss_scale_clean_steps").get<int>());
  return step;
}

}  // namespace pieces
}  // namespace zeroplan::exec
