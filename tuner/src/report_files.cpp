// Writing a tune's reports and exports to a folder, each file atomically (temporary name, then rename).
#include <fmt/format.h>

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

std::vector<std::filesystem::path> write_reports(const TuneResult& r, const std::filesystem::path& folder) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) throw SchemaError(fmt::format("{}: cannot write: {}", folder.string(), ec.message()));
  std::vector<std::filesystem::path> written;
  auto put = [&](const std::string& name, const std::string& content) {
    write_file(folder / name, content);
    written.push_back(folder / name);
  };
  put("report.md", report_markdown(r));
  put("report.html", report_html(r));
  put("tune.json", tune_json(r));
  if (const RankedPlan* best = r.best()) {
    const std::vector<Export> exports = export_all(best->plan, r.model, r.nodes_used, r.cluster.devices_per_node);
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
  return written;
}

}  // namespace zeroplan::tuner
