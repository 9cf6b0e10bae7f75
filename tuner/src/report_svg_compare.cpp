// Plots of predicted against measured figures (autopilot's runs and its fidelity grid) as inline SVG.
#include <fmt/format.h>

#include <algorithm>

#include "report_svg_axes.h"
#include "text.h"
#include "zeroplan/tuner/report_blocks.h"

namespace zeroplan::tuner::report {
namespace {

constexpr const char* kPredictedColor = "#1b9e77";
constexpr const char* kMeasuredColor = "#d95f02";

}  // namespace

std::string svg_predicted_measured_bars(const std::string& title, const std::string& unit,
                                        const std::vector<PredictedMeasured>& items, std::optional<double> limit) {
  const double row = 34, left = 190, width = 640;
  const double height = 50 + row * static_cast<double>(items.size()) + 30;
  double vmax = limit.value_or(0);
  for (const auto& i : items) vmax = std::max({vmax, i.predicted, i.measured.value_or(0)});
  if (vmax <= 0) vmax = 1;
  const double scale = (width - left - 90) / vmax;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} {1:.0f}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"10\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{2}</text>\n",
      width, height, text::html_escape(title));
  double y = 36;
  for (const auto& i : items) {
    std::string label = i.label + ": " + i.description.substr(0, 24);
    s += fmt::format("<text x=\"10\" y=\"{:.1f}\">{}<title>{}</title></text>\n", y + 14, text::html_escape(label),
                     text::html_escape(i.description));
    for (int k = 0; k < 2; ++k) {
      const std::optional<double> v = k == 0 ? std::optional<double>(i.predicted) : i.measured;
      const double yy = y + 14.0 * k;
      if (v) {
        s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"12\" fill=\"{}\"/>"
                         "<text x=\"{:.1f}\" y=\"{:.1f}\">{:.4g} {}</text>\n",
                         left, yy, std::max(1.0, *v * scale), k == 0 ? kPredictedColor : kMeasuredColor,
                         left + *v * scale + 4, yy + 10, *v, text::html_escape(unit));
      } else {
        s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#999\">not measured (run failed)</text>\n", left, yy + 10);
      }
    }
    y += row;
  }
  if (limit) {
    const double x = left + *limit * scale;
    s += fmt::format("<line x1=\"{0:.1f}\" y1=\"30\" x2=\"{0:.1f}\" y2=\"{1:.1f}\" stroke=\"#c00\" stroke-dasharray=\"4\"/>"
                     "<text x=\"{0:.1f}\" y=\"{2:.1f}\" fill=\"#c00\">budget</text>\n",
                     x, y, y + 12);
  }
  s += svg::legend(left, height - 18, {{"predicted", kPredictedColor}, {"measured", kMeasuredColor}});
  s += "</svg>\n";
  return s;
}

std::string svg_predicted_measured_scatter(const std::string& title, const std::string& unit,
                                           const std::vector<PredictedMeasured>& items, double band) {
  svg::Frame f;
  f.w = 520;
  f.h = 460;
  double vmax = 0;
  for (const auto& i : items)
    if (i.measured) vmax = std::max({vmax, i.predicted, *i.measured});
  f.xmax = f.ymax = std::max(1e-12, vmax * 1.1);
  std::string s = svg::axes(f, title, "predicted (" + unit + ")", "measured (" + unit + ")", true);
  // y = x, and the band of +-band relative error around it.
  s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#888\"/>\n", f.x(0), f.y(0),
                   f.x(f.xmax), f.y(f.ymax));
  for (double k : {1 + band, 1 / (1 + band)}) {
    const double x1 = k > 1 ? f.xmax / k : f.xmax, y1 = k > 1 ? f.ymax : f.xmax * k;
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#bbb\" stroke-dasharray=\"4,3\"/>\n",
                     f.x(0), f.y(0), f.x(x1), f.y(y1));
  }
  for (const auto& i : items) {
    if (!i.measured) continue;
    const double error = *i.measured > 0 ? (i.predicted - *i.measured) / *i.measured : 0;
    s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"{}\"><title>{}: {} predicted {:.4g}, measured "
                     "{:.4g} {} ({:+.1f}%)</title></circle>"
                     "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\">{}</text>\n",
                     f.x(i.predicted), f.y(*i.measured), kMeasuredColor, text::html_escape(i.label),
                     text::html_escape(i.description), i.predicted, *i.measured, text::html_escape(unit), 100 * error,
                     f.x(i.predicted) + 6, f.y(*i.measured) - 4, text::html_escape(i.label));
  }
  s += svg::legend(f.left, f.h - 18, {{"plan", kMeasuredColor}, {"measured = predicted", "#888"},
                                      {fmt::format("+-{:.0f}%", 100 * band), "#bbb"}});
  s += "</svg>\n";
  return s;
}

}  // namespace zeroplan::tuner::report
