// A report as a list of blocks (headings, paragraphs, lists, tables, code, plots), rendered to Markdown
// and to self-contained HTML by one pair of renderers: `zeroplan tune`'s report and autopilot's use
// both. Also the plots that compare predicted with measured figures, as inline SVG.
//
//   std::vector<Block> d{Block::heading(1, "title"), Block::table({"plan", "step s"}, {{"#1", "0.12"}})};
//   std::string md = render_markdown(d);
//   std::string html = render_html("title", d, [](const std::string& plot) { return svg_for(plot); });
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace zeroplan::tuner::report {

// Text in blocks is plain, except three inline forms both renderers understand: `code` spans, **strong**
// and [text](link) (HTML: <code>, <strong>, <a href>; Markdown: as written).
struct Block {
  enum class Kind { heading, paragraph, list, table, code, plot };
  Kind kind = Kind::paragraph;
  int level = 2;                                 // heading
  std::string text;                              // heading, paragraph, code; plot: which plot
  std::vector<std::string> items;                // list
  std::vector<std::string> header;               // table
  std::vector<std::vector<std::string>> rows;    // table

  static Block heading(int level, std::string text);
  static Block paragraph(std::string text);
  static Block list(std::vector<std::string> items);
  static Block table(std::vector<std::string> header, std::vector<std::vector<std::string>> rows);
  static Block code(std::string text);
  static Block plot(std::string which);
};

// Markdown: "#" headings, "- " lists, pipe tables ("|" in a cell escaped), fenced code; plots are left
// out (they are in the HTML).
std::string render_markdown(const std::vector<Block>& blocks);

// The SVG for a plot block's name ("" draws nothing).
using PlotRenderer = std::function<std::string(const std::string& which)>;

// A self-contained HTML page titled `title`: <h1>-<h6>, <p>, <ul>, <table>, <pre><code> for code
// blocks only, and `plot(which)` inline for each plot block. No scripts, no external resources.
std::string render_html(const std::string& title, const std::vector<Block>& blocks, const PlotRenderer& plot);

// ---- plots of predicted against measured figures ----

struct PredictedMeasured {
  std::string label;                // "#1", "g07"
  std::string description;          // a tooltip, e.g. the plan's knobs
  double predicted = 0;
  std::optional<double> measured;   // none: not measured (the run failed)
};

// One row per item with a predicted bar and a measured bar, in `unit`; `limit` draws a dashed line
// (a budget).
std::string svg_predicted_measured_bars(const std::string& title, const std::string& unit,
                                        const std::vector<PredictedMeasured>& items, std::optional<double> limit);

// Measured (y) against predicted (x) with the diagonal y = x and the +-`band` relative error lines;
// items without a measurement are left out.
std::string svg_predicted_measured_scatter(const std::string& title, const std::string& unit,
                                           const std::vector<PredictedMeasured>& items, double band);

}  // namespace zeroplan::tuner::report
