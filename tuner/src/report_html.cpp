// report.html: the report's blocks as HTML with inline SVG plots; no scripts, no external resources.
#include "report_document.h"
#include "text.h"
#include "zeroplan/tuner/report.h"

namespace zeroplan::tuner {
namespace {

// Escapes, then turns `code` spans into <code>.
std::string inline_html(const std::string& s) {
  const std::string e = text::html_escape(s);
  std::string out;
  bool open = false;
  for (char c : e) {
    if (c == '`') {
      out += open ? "</code>" : "<code>";
      open = !open;
    } else {
      out += c;
    }
  }
  if (open) out += "</code>";
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

std::string report_html(const TuneResult& r) {
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
                  text::html_escape("zeroplan tune: " + r.model.name + " on " + r.cluster.name) + "</title>\n<style>" +
                  kStyle + "</style>\n</head>\n<body>\n";
  for (const report::Block& b : report::build_document(r)) {
    switch (b.kind) {
      case report::Block::Kind::heading: {
        const std::string tag = "h" + std::to_string(b.level);
        h += "<" + tag + ">" + inline_html(b.text) + "</" + tag + ">\n";
        break;
      }
      case report::Block::Kind::paragraph: h += "<p>" + inline_html(b.text) + "</p>\n"; break;
      case report::Block::Kind::list:
        h += "<ul>\n";
        for (const auto& i : b.items) h += "<li>" + inline_html(i) + "</li>\n";
        h += "</ul>\n";
        break;
      case report::Block::Kind::table:
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
      case report::Block::Kind::code: h += "<pre><code>" + text::html_escape(b.text) + "</code></pre>\n"; break;
      case report::Block::Kind::plot:
        if (b.text == "pareto") h += report::svg_pareto(r);
        else if (b.text == "breakdown") h += report::svg_breakdown(r);
        else if (b.text == "memory") h += report::svg_memory(r);
        break;
    }
  }
  h += "</body>\n</html>\n";
  return h;
}

}  // namespace zeroplan::tuner
