// Writing a tune's reports and exports to a folder, each file atomically (temporary name, then rename).
#include <fmt/format.h>

#include <unistd.h>

#include <fstream>
#include <system_error>

#include "text.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/tuner/exports.h"
#include "zeroplan/tuner/report.h"

namespace zeroplan::tuner {
namespace {

void write_file(const std::filesystem::path& file, const std::string& content) {
  const std::filesystem::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) throw SchemaError(fmt::format("{}: cannot write", file.string()));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec) throw SchemaError(fmt::format("{}: cannot write: {}", file.string(), ec.message()));
}

std::string notes_markdown(const std::vector<Export>& exports) {
  std::string s = "# Notes on the exports\n\n";
  for (const Export& e : exports) {
    s += fmt::format("## {} (`{}`)\n\n", e.tool, e.file);
    if (!e.expressible()) {
      s += fmt::format("Not written: {} cannot express this plan.\n\n", e.tool);
      for (const auto& u : e.unsupported) s += "- " + u + "\n";
      s += "\n";
    }
    for (const auto& n : e.notes) s += "- " + n + "\n";
    if (!e.notes.empty()) s += "\n";
  }
  return s;
}

}  // namespace

void check_report_folder(const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(folder, ec);
  if (ec || !fs::exists(st)) return;
  if (!fs::is_directory(st)) {
    throw SchemaError(fmt::format("{}: cannot write a tune there: it exists and is not a folder", folder.string()));
  }
  if (fs::is_empty(folder, ec) || fs::exists(folder / "tune.json")) return;
  std::string first;
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    first = e.path().filename().string();
    break;
  }
  throw SchemaError(fmt::format("{}: cannot write a tune there: the folder holds other files ({}) and no tune.json; "
                                "choose another -o",
                                folder.string(), first));
}

std::vector<std::filesystem::path> write_reports(const TuneResult& r, const std::filesystem::path& target) {
  namespace fs = std::filesystem;
  check_report_folder(target);
  std::error_code ec;
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  fs::create_directories(parent, ec);
  if (ec) throw SchemaError(fmt::format("{}: cannot write: {}", target.string(), ec.message()));
  const std::string stem = target.filename().empty() ? target.parent_path().filename().string() : target.filename().string();
  const std::string tag = fmt::format("{}", static_cast<unsigned long long>(::getpid()));
  const fs::path folder = parent / ("." + stem + ".zeroplan-new-" + tag);
  fs::remove_all(folder, ec);
  fs::create_directories(folder, ec);
  if (ec) throw SchemaError(fmt::format("{}: cannot write: {}", target.string(), ec.message()));
  std::vector<std::filesystem::path> written;
  auto put = [&](const std::string& name, const std::string& content) {
    write_file(folder / name, content);
    written.push_back(target / name);
  };
  put("report.md", report_markdown(r));
  put("report.html", report_html(r));
  put("tune.json", tune_json(r));
  if (const RankedPlan* best = r.best()) {
    const std::vector<Export> exports = export_all(best->plan, r.model, r.nodes_used, r.cluster.devices_per_node, r.cluster.device.kind);
    for (const Export& e : exports) {
      if (e.expressible()) put(e.file, e.text);
      else {
        std::string why = fmt::format("{} cannot express the plan zeroplan chose, so no {} was written:\n", e.tool, e.file);
        for (const auto& u : e.unsupported) why += "- " + u + "\n";
        put(e.file + ".unsupported.txt", why);
      }
    }
    put("export_notes.md", notes_markdown(exports));
  }
  // The new folder takes the target's place: the previous tune moves aside first and goes once the new
  // one is in (a crash in between leaves both, never a mix).
  const fs::path old = parent / ("." + stem + ".zeroplan-old-" + tag);
  const bool had = fs::exists(target, ec);
  if (had) {
    fs::remove_all(old, ec);
    fs::rename(target, old, ec);
    if (ec) throw SchemaError(fmt::format("{}: cannot replace the previous tune: {}", target.string(), ec.message()));
  }
  fs::rename(folder, target, ec);
  if (ec) throw SchemaError(fmt::format("{}: cannot write: {}", target.string(), ec.message()));
  if (had) fs::remove_all(old, ec);
  return written;
}

}  // namespace zeroplan::tuner
