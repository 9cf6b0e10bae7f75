// Private: the SVG frame, axes and legend every report plot is drawn on (report_svg.cpp), with
// fixed-precision coordinates so identical inputs give identical text.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace zeroplan::tuner::report::svg {

// A plot area of w x h pixels with margins; values 0..xmax and 0..ymax map onto it.
struct Frame {
  double w = 760, h = 420, left = 80, right = 24, top = 36, bottom = 76;
  double xmax = 1, ymax = 1;
  double x(double v) const { return left + (w - left - right) * v / xmax; }
  double y(double v) const { return h - bottom - (h - top - bottom) * v / ymax; }
};

// A "nice" tick step (1, 2, 5 x 10^k) giving about `n` ticks over [0, max].
double nice_step(double max, int n);
std::string tick_label(double v, double step);
// The opening <svg> with the title, both axes, x ticks (and y ticks when `yticks`) and the labels.
std::string axes(const Frame& f, const std::string& title, const std::string& xlabel, const std::string& ylabel, bool yticks);
// A row of (label, colour) swatches from (x, y).
std::string legend(double x, double y, const std::vector<std::pair<std::string, std::string>>& items);

}  // namespace zeroplan::tuner::report::svg
