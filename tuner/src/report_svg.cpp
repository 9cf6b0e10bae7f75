// The report's plots as inline SVG, with fixed-precision coordinates (byte-identical for identical
// results).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "report_common.h"
#include "report_document.h"
#include "report_svg_axes.h"
#include "text.h"

namespace zeroplan::tuner::report {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;
const std::array<const char*, 6> kCategoryColors = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#bab0ac"};

}  // namespace

namespace svg {

// A "nice" tick step (1, 2, 5 x 10^k) giving about `n` ticks over [0, max].
double nice_step(double max, int n) {
  if (max <= 0) return 1;
  const double raw = max / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

std::string tick_label(double v, double step) {
  if (step >= 1) return fmt::format("{:.0f}", v);
  if (step >= 0.1) return fmt::format("{:.1f}", v);
  if (step >= 0.01) return fmt::format("{:.2f}", v);
  return fmt::format("{:.3g}", v);
}

std::string axes(const Frame& f, const std::string& title, const std::string& xlabel, const std::string& ylabel, bool yticks) {
  std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
                              "viewBox=\"0 0 {:.0f} {:.0f}\" font-family=\"sans-serif\" font-size=\"12\">\n",
                              f.w, f.h, f.w, f.h);
  s += fmt::format("<text x=\"{:.1f}\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>\n", f.left, text::html_escape(title));
  s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#333\"/>\n", f.left, f.h - f.bottom,
                   f.w - f.right);
  s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#333\"/>\n", f.left, f.top,
                   f.h - f.bottom);
  const double xs = nice_step(f.xmax, 6);
  for (double v = 0; v <= f.xmax * (1 + 1e-9); v += xs) {
    s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#333\"/>"
                     "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4}</text>\n",
                     f.x(v), f.h - f.bottom, f.h - f.bottom + 5, f.h - f.bottom + 18, tick_label(v, xs));
  }
  if (yticks) {
    const double ys = nice_step(f.ymax, 5);
    for (double v = 0; v <= f.ymax * (1 + 1e-9); v += ys) {
      s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#eee\"/>"
                       "<text x=\"{3:.1f}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
                       f.left, f.y(v), f.w - f.right, f.left - 6, f.y(v) + 4, tick_label(v, ys));
    }
  }
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", (f.left + f.w - f.right) / 2, f.h - f.bottom + 36,
                   text::html_escape(xlabel));
  if (!ylabel.empty())
    s += fmt::format("<text transform=\"translate(18 {:.1f}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
                     (f.top + f.h - f.bottom) / 2, text::html_escape(ylabel));
  return s;
}

std::string legend(double x, double y, const std::vector<std::pair<std::string, std::string>>& items) {
  std::string s;
  for (const auto& [label, color] : items) {
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
                     x, y, color, x + 16, y + 10, text::html_escape(label));
    x += 24 + 7.0 * static_cast<double>(label.size());
  }
  return s;
}

}  // namespace svg

using svg::axes;
using svg::Frame;
using svg::legend;

std::string svg_pareto(const TuneResult& r) {
  Frame f;
  double xmax = static_cast<double>(r.limits.device_bytes) / kGiB, ymax = 0;
  for (const auto& p : r.fitting_points) {
    xmax = std::max(xmax, static_cast<double>(p.device_bytes) / kGiB);
    ymax = std::max(ymax, p.samples_per_s);
  }
  const bool show_default = r.default_plan.simulated;
  if (show_default) ymax = std::max(ymax, r.default_plan.prediction.samples_per_s);
  f.xmax = std::max(1e-9, xmax * 1.1);
  // A default far beyond the range is drawn at the right edge, labelled with its real size.
  if (show_default && static_cast<double>(r.default_plan.device_needed_bytes) / kGiB <= 2 * f.xmax)
    f.xmax = std::max(f.xmax, static_cast<double>(r.default_plan.device_needed_bytes) / kGiB * 1.05);
  f.ymax = std::max(1e-9, ymax * 1.1);
  std::string s = axes(f, "Pareto front: device memory per rank against throughput", "device peak per rank (GiB)", "samples/s", true);
  const double lx = f.x(static_cast<double>(r.limits.device_bytes) / kGiB);
  s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#c00\" stroke-dasharray=\"5,4\"/>"
                   "<text x=\"{3:.1f}\" y=\"{4:.1f}\" fill=\"#c00\">device limit</text>\n",
                   lx, f.top, f.h - f.bottom, lx + 4, f.top + 12);
  for (const auto& p : r.fitting_points)
    s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"#bbb\"/>\n", f.x(static_cast<double>(p.device_bytes) / kGiB),
                     f.y(p.samples_per_s));
  std::string path;
  for (const RankedPlan& p : r.pareto)
    path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "M" : " L", f.x(static_cast<double>(p.prediction.device.total_bytes()) / kGiB),
                        f.y(p.prediction.samples_per_s));
  if (!path.empty()) s += "<path d=\"" + path + "\" fill=\"none\" stroke=\"#4e79a7\" stroke-width=\"1.5\"/>\n";
  for (const RankedPlan& p : r.pareto)
    s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"#4e79a7\"><title>{}</title></circle>\n",
                     f.x(static_cast<double>(p.prediction.device.total_bytes()) / kGiB), f.y(p.prediction.samples_per_s),
                     text::html_escape(summary(p.plan)));
  if (const RankedPlan* w = r.best())
    s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"6\" fill=\"none\" stroke=\"#e15759\" stroke-width=\"2.5\"><title>winner: "
                     "{}</title></circle>\n",
                     f.x(static_cast<double>(w->prediction.device.total_bytes()) / kGiB), f.y(w->prediction.samples_per_s),
                     text::html_escape(summary(w->plan)));
  if (show_default) {
    const double gib = static_cast<double>(r.default_plan.device_needed_bytes) / kGiB;
    const double x = f.x(std::min(gib, f.xmax));
    const double y = f.y(r.default_plan.prediction.samples_per_s);
    if (gib > f.xmax)
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"#f28e2b\">default: {} &#8594;</text>\n", x - 8,
                       y - 8, text::bytes(r.default_plan.device_needed_bytes));
    s += fmt::format("<path d=\"M{:.1f},{:.1f} l10,10 m0,-10 l-10,10\" stroke=\"#f28e2b\" stroke-width=\"2\"><title>default (DDP, "
                     "no offload){}</title></path>\n",
                     x - 5, y - 5, r.default_plan.fits ? "" : ": does not fit");
  }
  s += legend(f.left, f.h - 18,
              {{"fitting plans", "#bbb"}, {"Pareto front", "#4e79a7"}, {"winner", "#e15759"}, {"default", "#f28e2b"}});
  s += "</svg>\n";
  return s;
}

std::string svg_breakdown(const TuneResult& r) {
  Frame f;
  const std::size_t n = r.ranking.size();
  f.h = 40 + 26.0 * static_cast<double>(n) + 16 + f.bottom;
  f.top = 40;
  double tmax = 0;
  for (const RankedPlan& p : r.ranking) tmax = std::max(tmax, p.prediction.step_time_s);
  f.xmax = std::max(1e-12, tmax * 1.05);
  f.ymax = 1;
  std::string s = axes(f, "Time breakdown of the top plans (one step)", "seconds", "", false);
  const char* colors[] = {"#4e79a7", "#f28e2b", "#bab0ac"};
  for (std::size_t i = 0; i < n; ++i) {
    const Prediction& q = r.ranking[i].prediction;
    double compute = 0;
    if (auto it = q.resource_busy_s.find("compute"); it != q.resource_busy_s.end()) compute = std::min(it->second, q.step_time_s);
    const double comm = std::clamp(q.exposed_comm_s, 0.0, q.step_time_s - compute);
    const double other = std::max(0.0, q.step_time_s - compute - comm);
    const double y = f.top + 8 + 26.0 * static_cast<double>(i);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">#{}</text>\n", f.left - 6, y + 13, i + 1);
    double x0 = 0;
    const double parts[] = {compute, comm, other};
    for (int k = 0; k < 3; ++k) {
      s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"18\" fill=\"{}\"><title>{}</title></rect>\n", f.x(x0),
                       y, f.x(x0 + parts[k]) - f.x(x0), colors[k], text::html_escape(summary(r.ranking[i].plan)));
      x0 += parts[k];
    }
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{} ({})</text>\n", f.x(x0) + 4, y + 13, text::seconds(q.step_time_s), q.bound);
  }
  s += legend(f.left, f.h - 18, {{"compute", colors[0]}, {"exposed communication", colors[1]}, {"copies, host optimizer, idle", colors[2]}});
  s += "</svg>\n";
  return s;
}

std::string svg_memory(const TuneResult& r) {
  std::vector<std::pair<std::string, const Prediction*>> rows;
  if (const RankedPlan* w = r.best()) rows.emplace_back("winner", &w->prediction);
  if (r.ranking.size() > 1) rows.emplace_back("runner-up", &r.ranking[1].prediction);
  if (r.default_plan.simulated) rows.emplace_back("default", &r.default_plan.prediction);
  Frame f;
  f.h = 40 + 30.0 * static_cast<double>(rows.size()) + 16 + f.bottom;
  f.top = 40;
  // The range covers the limit and the fitting rows; a row far beyond it is cut at the edge.
  double xmax = static_cast<double>(r.limits.device_bytes);
  for (const auto& [name, p] : rows)
    if (p->device.total_bytes() <= 2 * r.limits.device_bytes) xmax = std::max(xmax, static_cast<double>(p->device.total_bytes()));
  f.xmax = std::max(1e-9, xmax / kGiB * 1.25);
  f.ymax = 1;
  std::string s = axes(f, "Device memory at the peak by category (per rank)", "GiB", "", false);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto by = device_by_category(*rows[i].second);
    const double y = f.top + 8 + 30.0 * static_cast<double>(i);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", f.left - 6, y + 15, rows[i].first);
    double x0 = 0;
    for (std::size_t k = 0; k < kCategories.size(); ++k) {
      const double v = std::min(static_cast<double>(by.at(kCategories[k])) / kGiB, f.xmax - x0);
      if (v <= 0) continue;
      s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"22\" fill=\"{}\"><title>{}: {}</title></rect>\n",
                       f.x(x0), y, f.x(x0 + v) - f.x(x0), kCategoryColors[k], kCategories[k],
                       text::bytes(by.at(kCategories[k])));
      x0 += v;
    }
    const bool cut = static_cast<double>(rows[i].second->device.total_bytes()) / kGiB > f.xmax;
    if (cut)
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"#fff\" font-weight=\"bold\">{} (cut) &#8594;</text>\n",
                       f.x(x0) - 4, y + 15, text::bytes(rows[i].second->device.total_bytes()));
    else
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", f.x(x0) + 4, y + 15, text::bytes(rows[i].second->device.total_bytes()));
  }
  const double lx = f.x(static_cast<double>(r.limits.device_bytes) / kGiB);
  s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#c00\" stroke-dasharray=\"5,4\"/>"
                   "<text x=\"{3:.1f}\" y=\"{4:.1f}\" fill=\"#c00\">limit {5}</text>\n",
                   lx, f.top - 14, f.h - f.bottom, lx + 4, f.top - 4, text::bytes(r.limits.device_bytes));
  std::vector<std::pair<std::string, std::string>> items;
  for (std::size_t k = 0; k < kCategories.size(); ++k) items.emplace_back(kCategories[k], kCategoryColors[k]);
  s += legend(f.left, f.h - 18, items);
  s += "</svg>\n";
  return s;
}

}  // namespace zeroplan::tuner::report
