#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "zeroplan/tuner/tune.h"

namespace zeroplan::tuner {

std::function<void(const Progress&)> stderr_progress_bar() {
  const bool tty = isatty(fileno(stderr)) != 0;
  auto last_decile = std::make_shared<std::int64_t>(-1);
  return [tty, last_decile](const Progress& p) {
    const std::int64_t pct = p.total > 0 ? p.done * 100 / p.total : 100;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(pct * kWidth / 100);
    const std::string bar = std::string(static_cast<std::size_t>(filled), '#') + std::string(static_cast<std::size_t>(kWidth - filled), '.');
    const std::string line = fmt::format("tune [{}] {:3}% {}/{} candidates, {} simulated, {} fit", bar, pct, p.done, p.total,
                                         p.simulations, p.fitting);
    if (tty) {
      fmt::print(stderr, "\r{}{}", line, p.done == p.total ? "\n" : "");
    } else if (pct / 10 != *last_decile || p.done == p.total) {
      *last_decile = pct / 10;
      fmt::print(stderr, "{}\n", line);
    }
    std::fflush(stderr);
  };
}

}  // namespace zeroplan::tuner
