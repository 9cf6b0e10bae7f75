#include <fmt/core.h>

#include <cmath>
#include <filesystem>

#include "cli.h"
#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/zoo.h"

namespace zeroplan::cli {

std::string registry_footer() {
  std::string out = "Models (--model NAME [--preset P] [--opt k=v]):\n";
  for (const auto& m : zoo::registered_models()) {
    out += fmt::format("  {:<10} {}\n", m.name, m.description);
    if (!m.presets.empty()) {
      std::string presets;
      for (const auto& [name, _] : m.presets) presets += (presets.empty() ? "" : ", ") + name;
      out += fmt::format("  {:<10}   presets: {}\n", "", presets);
    }
  }
  out += "Cluster profiles (--cluster NAME[:NODES] or FILE):\n";
  try {
    for (const auto& c : list_shipped_clusters()) out += fmt::format("  {:<16} {}\n", c.name, c.description);
  } catch (const std::exception& e) {
    out += fmt::format("  (none found: {})\n", e.what());
  }
  return out;
}

std::map<std::string, std::string> parse_key_values(const std::vector<std::string>& items,
                                                    const std::string& what) {
  std::map<std::string, std::string> out;
  for (const auto& item : items) {
    size_t start = 0;
    while (start <= item.size()) {
      size_t comma = item.find(',', start);
      std::string kv = item.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (!kv.empty()) {
        auto eq = kv.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == kv.size())
          throw ExitError(kBadInput, fmt::format("{}: expected key=value, got \"{}\"", what, kv));
        out[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  return out;
}

CLI::Validator number_in(double lo, double hi, bool open_lo) {
  return CLI::Validator(
      [lo, hi, open_lo](std::string& text) -> std::string {
        double v = 0;
        std::size_t used = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return fmt::format("expected a number, got \"{}\"", text);
        if (!std::isfinite(v)) return fmt::format("must be a finite number (got {})", text);
        if (open_lo ? !(v > lo) : !(v >= lo)) return fmt::format("must be {} {:g} (got {})", open_lo ? ">" : ">=", lo, text);
        if (v > hi) return fmt::format("must be <= {:g} (got {})", hi, text);
        return "";
      },
      "");
}

CLI::Validator model_profile_file() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        if (std::filesystem::is_regular_file(path)) return "";
        // A bare word is most likely a built-in model's name: show the command for that model.
        const bool bare = path.find_first_of("/.") == std::string::npos && !path.empty();
        const std::string name = bare ? path : "gpt";
        return fmt::format("no file \"{}\": this wants a ModelProfile (JSON); make one with `zeroplan profile --model {} "
                           "-o {}.json` (or --torchscript FILE, --analytic gpt)", path, name, name);
      },
      "PROFILE.json");
}

}  // namespace zeroplan::cli
