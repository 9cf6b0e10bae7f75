#include "report_document.h"
#include "zeroplan/tuner/report.h"

namespace zeroplan::tuner {
namespace {

std::string cell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

}  // namespace

std::string report_markdown(const TuneResult& r) {
  std::string md;
  for (const report::Block& b : report::build_document(r)) {
    switch (b.kind) {
      case report::Block::Kind::heading: md += std::string(static_cast<std::size_t>(b.level), '#') + " " + b.text + "\n\n"; break;
      case report::Block::Kind::paragraph: md += b.text + "\n\n"; break;
      case report::Block::Kind::list:
        for (const auto& i : b.items) md += "- " + i + "\n";
        md += "\n";
        break;
      case report::Block::Kind::table: {
        md += "|";
        for (const auto& h : b.header) md += " " + cell(h) + " |";
        md += "\n|";
        for (std::size_t i = 0; i < b.header.size(); ++i) md += "---|";
        md += "\n";
        for (const auto& row : b.rows) {
          md += "|";
          for (const auto& c : row) md += " " + cell(c) + " |";
          md += "\n";
        }
        md += "\n";
        break;
      }
      case report::Block::Kind::code: md += "```\n" + b.text + "\n```\n\n"; break;
      case report::Block::Kind::plot: break;  // plots are in report.html
    }
  }
  return md;
}

}  // namespace zeroplan::tuner
