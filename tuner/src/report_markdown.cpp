// The blocks' constructors and their Markdown renderer (report.md of tune and of autopilot).
#include "report_document.h"
#include "zeroplan/tuner/report.h"
#include "zeroplan/tuner/report_blocks.h"

namespace zeroplan::tuner {
namespace report {
namespace {

std::string md_cell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

}  // namespace

Block Block::heading(int level, std::string text) { return Block{Kind::heading, level, std::move(text), {}, {}, {}}; }
Block Block::paragraph(std::string text) { return Block{Kind::paragraph, 0, std::move(text), {}, {}, {}}; }
Block Block::list(std::vector<std::string> items) { return Block{Kind::list, 0, {}, std::move(items), {}, {}}; }
Block Block::table(std::vector<std::string> header, std::vector<std::vector<std::string>> rows) {
  return Block{Kind::table, 0, {}, {}, std::move(header), std::move(rows)};
}
Block Block::code(std::string text) { return Block{Kind::code, 0, std::move(text), {}, {}, {}}; }
Block Block::plot(std::string which) { return Block{Kind::plot, 0, std::move(which), {}, {}, {}}; }

std::string render_markdown(const std::vector<Block>& blocks) {
  std::string md;
  for (const Block& b : blocks) {
    switch (b.kind) {
      case Block::Kind::heading: md += std::string(static_cast<std::size_t>(b.level), '#') + " " + b.text + "\n\n"; break;
      case Block::Kind::paragraph: md += b.text + "\n\n"; break;
      case Block::Kind::list:
        for (const auto& i : b.items) md += "- " + i + "\n";
        md += "\n";
        break;
      case Block::Kind::table: {
        md += "|";
        for (const auto& h : b.header) md += " " + md_cell(h) + " |";
        md += "\n|";
        for (std::size_t i = 0; i < b.header.size(); ++i) md += "---|";
        md += "\n";
        for (const auto& row : b.rows) {
          md += "|";
          for (const auto& c : row) md += " " + md_cell(c) + " |";
          md += "\n";
        }
        md += "\n";
        break;
      }
      case Block::Kind::code: md += "```\n" + b.text + "\n```\n\n"; break;
      case Block::Kind::plot: break;  // plots are in the HTML
    }
  }
  return md;
}

}  // namespace report

std::string report_markdown(const TuneResult& r) { return report::render_markdown(report::build_document(r)); }

}  // namespace zeroplan::tuner
