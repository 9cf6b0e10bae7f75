// Blocks as a self-contained HTML page with inline SVG plots (tune's report.html and autopilot's); no
// scripts, no external resources.
#include "report_document.h"
#include "text.h"
#include "zeroplan/tuner/report.h"
#include "zeroplan/tuner/report_blocks.h"

namespace zeroplan::tuner {
namespace {

// Escapes, then turns `code` spans into <code>, **strong** into <strong>, *emphasis* into <em> (a single
// star before a non-space with another star after it; else a star) and [text](link) into <a>.
std::string inline_html(const std::string& s) {
  std::string out;
  bool code = false, strong = false, em = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '`') {
      out += code ? "</code>" : "<code>";
      code = !code;
    } else if (!code && c == '*' && i + 1 < s.size() && s[i + 1] == '*') {
      out += strong ? "</strong>" : "<strong>";
      strong = !strong;
      ++i;
    } else if (!code && c == '*' && (em || (i + 1 < s.size() && s[i + 1] != ' ' && s.find('*', i + 1) != std::string::npos))) {
      out += em ? "</em>" : "<em>";
      em = !em;
    } else if (!code && c == '[') {
      const std::size_t close = s.find("](", i);
      const std::size_t end = close == std::string::npos ? close : s.find(')', close);
      if (end == std::string::npos || s.find('[', i + 1) < close) {
        out += '[';
        continue;
      }
      out += "<a href=\"" + text::html_escape(s.substr(close + 2, end - close - 2)) + "\">" +
             text::html_escape(s.substr(i + 1, close - i - 1)) + "</a>";
      i = end;
    } else {
      out += text::html_escape(std::string_view(&s[i], 1));
    }
  }
  if (code) out += "</code>";
  if (strong) out += "</strong>";
  if (em) out += "</em>";
  return out;
}

constexpr const char* kStyle =
    "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;"
    "color:#222;line-height:1.45}"
    "table{border-collapse:collapse;margin:.5em 0 1.2em}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;"
    "vertical-align:top;font-size:.92em}th{background:#f3f3f3}code{background:#f3f3f3;padding:0 .2em}"
    "h1{font-size:1.5em}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ddd}h3{font-size:1.05em}"
    "svg{display:block;margin:.5em 0 1.5em}";

}  // namespace

namespace report {

std::string render_html(const std::string& title, const std::vector<Block>& blocks, const PlotRenderer& plot) {
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
                  text::html_escape(title) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  for (const Block& b : blocks) {
    switch (b.kind) {
      case Block::Kind::heading: {
        const std::string tag = "h" + std::to_string(b.level);
        h += "<" + tag + ">" + inline_html(b.text) + "</" + tag + ">\n";
        break;
      }
      case Block::Kind::paragraph: h += "<p>" + inline_html(b.text) + "</p>\n"; break;
      case Block::Kind::list:
        h += "<ul>\n";
        for (const auto& i : b.items) h += "<li>" + inline_html(i) + "</li>\n";
        h += "</ul>\n";
        break;
      case Block::Kind::table:
        h += "<table>\n<tr>";
        for (const auto& c : b.header) h += "<th>" + inline_html(c) + "</th>";
        h += "</tr>\n";
        for (const auto& row : b.rows) {
          h += "<tr>";
          for (const auto& c : row) h += "<td>" + inline_html(c) + "</td>";
          h += "</tr>\n";
        }
        h += "</table>\n";
        break;
      case Block::Kind::code: h += "<pre><code>" + text::html_escape(b.text) + "</code></pre>\n"; break;
      case Block::Kind::plot:
        if (plot) h += plot(b.text);
        break;
    }
  }
  h += "</body>\n</html>\n";
  return h;
}

}  // namespace report

std::string report_html(const TuneResult& r) {
  return report::render_html("zeroplan tune: " + r.model.name + " on " + r.cluster.name, report::build_document(r),
                             [&r](const std::string& which) -> std::string {
                               if (which == "pareto") return report::svg_pareto(r);
                               if (which == "breakdown") return report::svg_breakdown(r);
                               if (which == "memory") return report::svg_memory(r);
                               return "";
                             });
}

}  // namespace zeroplan::tuner
