// The report blocks' two renderers (tune's report and autopilot's) and the predicted-vs-measured plots.
#include "zeroplan/tuner/report_blocks.h"

#include <gtest/gtest.h>

#include <string>

namespace zeroplan::tuner::report {
namespace {

std::vector<Block> sample() {
  return {Block::heading(1, "title"),
          Block::paragraph("Budget **12.0 MiB**, see [tune/report.md](tune/report.md) and `plan.json` <x>."),
          Block::list({"one", "two"}),
          Block::table({"plan", "a|b"}, {{"#1", "0.1"}, {"g01", ""}}),
          Block::plot("fig"),
          Block::code("x < y")};
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ReportBlocks, MarkdownWritesEveryBlockAndLeavesPlotsOut) {
  EXPECT_EQ(render_markdown(sample()),
            "# title\n\n"
            "Budget **12.0 MiB**, see [tune/report.md](tune/report.md) and `plan.json` <x>.\n\n"
            "- one\n- two\n\n"
            "| plan | a\\|b |\n|---|---|\n| #1 | 0.1 |\n| g01 |  |\n\n"
            "```\nx < y\n```\n\n");
}

TEST(ReportBlocks, HtmlHasRealTablesHeadingsAndInlineFigures) {
  const std::string html = render_html("t <1>", sample(), [](const std::string& which) {
    return which == "fig" ? std::string("<svg id=\"fig\"></svg>\n") : std::string();
  });
  EXPECT_NE(html.find("<title>t &lt;1&gt;</title>"), std::string::npos);
  EXPECT_NE(html.find("<h1>title</h1>"), std::string::npos);
  EXPECT_NE(html.find("<p>Budget <strong>12.0 MiB</strong>, see <a href=\"tune/report.md\">tune/report.md</a> and "
                      "<code>plan.json</code> &lt;x&gt;.</p>"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("<ul>\n<li>one</li>\n<li>two</li>\n</ul>"), std::string::npos);
  EXPECT_NE(html.find("<table>\n<tr><th>plan</th><th>a|b</th></tr>\n<tr><td>#1</td><td>0.1</td></tr>"), std::string::npos);
  EXPECT_NE(html.find("<svg id=\"fig\"></svg>"), std::string::npos);
  // Only the code block is preformatted; no Markdown table syntax leaks into the page.
  EXPECT_EQ(count(html, "<pre>"), 1);
  EXPECT_NE(html.find("<pre><code>x &lt; y</code></pre>"), std::string::npos);
  EXPECT_EQ(html.find("|---|"), std::string::npos);
}

TEST(ReportBlocks, UnmatchedMarkupStaysText) {
  const std::string html = render_html("t", {Block::paragraph("a [b] c ** d")}, nullptr);
  EXPECT_NE(html.find("<p>a [b] c <strong> d</strong></p>"), std::string::npos) << html;
}

// *emphasis* (autopilot's "labelled *predicted*") is <em>; a lone star or one before a space stays a star.
TEST(ReportBlocks, SingleStarsAreEmphasisWhenTheyPair) {
  const std::string html =
      render_html("t", {Block::paragraph("labelled *predicted*, **strong**, 2 * 3 and a*"), Block::paragraph("x *y")}, nullptr);
  EXPECT_NE(html.find("<p>labelled <em>predicted</em>, <strong>strong</strong>, 2 * 3 and a*</p>"), std::string::npos)
      << html;
  EXPECT_NE(html.find("<p>x *y</p>"), std::string::npos) << html;
}

TEST(ReportBlocks, PredictedMeasuredPlots) {
  const std::vector<PredictedMeasured> items = {
      {"#1", "stage 3", 1.0, 1.1}, {"#2", "stage 2", 2.0, std::nullopt}, {"g<3>", "stage 0", 0.5, 0.4}};
  const std::string scatter = svg_predicted_measured_scatter("step time", "s", items, 0.1);
  EXPECT_EQ(scatter.rfind("<svg", 0), 0u);
  EXPECT_EQ(count(scatter, "<circle"), 2);  // the unmeasured plan is left out
  EXPECT_NE(scatter.find("g&lt;3&gt;"), std::string::npos);
  EXPECT_NE(scatter.find("(-9.1%)"), std::string::npos);  // #1: (1.0 - 1.1) / 1.1
  EXPECT_EQ(scatter, svg_predicted_measured_scatter("step time", "s", items, 0.1));
  const std::string bars = svg_predicted_measured_bars("memory", "MiB", items, 1.5);
  EXPECT_EQ(count(bars, "<rect") - 2, 5);  // 3 predicted + 2 measured bars, and the legend's 2 swatches
  EXPECT_NE(bars.find("not measured (run failed)"), std::string::npos);
  EXPECT_NE(bars.find(">budget</text>"), std::string::npos);
}

}  // namespace
}  // namespace zeroplan::tuner::report
