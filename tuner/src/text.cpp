#include "text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace zeroplan::tuner::text {

std::string bytes(std::int64_t b) {
  const double a = std::abs(static_cast<double>(b));
  const char* sign = b < 0 ? "-" : "";
  if (a >= 1024.0 * 1024 * 1024 * 1024) return fmt::format("{}{:.2f} TiB", sign, a / (1024.0 * 1024 * 1024 * 1024));
  if (a >= 1024.0 * 1024 * 1024) return fmt::format("{}{:.2f} GiB", sign, a / (1024.0 * 1024 * 1024));
  if (a >= 1024.0 * 1024) return fmt::format("{}{:.1f} MiB", sign, a / (1024.0 * 1024));
  if (a >= 1024.0) return fmt::format("{}{:.1f} KiB", sign, a / 1024.0);
  return fmt::format("{}{} B", sign, static_cast<std::int64_t>(a));
}

std::string seconds(double s) {
  const double a = std::abs(s);
  if (a >= 1.0) return fmt::format("{:.3f} s", s);
  if (a >= 1e-3) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

std::string percent(double relative) { return fmt::format("{:+.1f}%", relative * 100.0); }

std::string num(double v) { return fmt::format("{}", v); }

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string closest(std::string_view word, const std::vector<std::string>& candidates) {
  const std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  std::string best;
  std::size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace zeroplan::tuner::text
