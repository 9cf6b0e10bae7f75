#include <fmt/core.h>

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

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

namespace {
CLI::Validator writable(bool folder) {
  return CLI::Validator(
      [folder](std::string& text) -> std::string {
        namespace fs = std::filesystem;
        if (text.empty()) return "is an empty path";
        std::error_code ec;
        const fs::path path = fs::absolute(fs::path(text), ec);
        fs::path dir = path.parent_path();
        if (folder) {  // made as needed: the nearest folder of the path that exists must take files
          dir = path;
          while (!fs::exists(dir, ec) && dir != dir.root_path()) dir = dir.parent_path();
          if (dir == path && !fs::is_directory(dir, ec)) return fmt::format("cannot write into {}: it is a file", text);
        } else if (!fs::exists(dir, ec)) {
          return fmt::format("cannot write {}: no folder {}", text, dir.string());
        }
        if (!fs::is_directory(dir, ec)) return fmt::format("cannot write {}: {} is not a folder", text, dir.string());
        // Creating a file there is the only test that holds everywhere (/proc, read-only mounts, root).
        std::string probe = (dir / ".zeroplan-write-test-XXXXXX").string();
        const int fd = ::mkstemp(probe.data());
        if (fd < 0) return fmt::format("cannot write {}: {}: {}", text, dir.string(), std::strerror(errno));
        ::close(fd);
        fs::remove(probe, ec);
        return "";
      },
      "");
}
}  // namespace

CLI::Validator output_path() { return writable(false); }

CLI::Validator threads_option() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
        const long most = 16L * cores;
        long v = -1;
        std::size_t used = 0;
        try {
          v = std::stol(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return fmt::format("expected a whole number, got \"{}\"", text);
        if (v < 0 || v > most)
          return fmt::format("must be 0 (all cores) to {} (16 x this machine's {} cores), got {}", most, cores, v);
        return "";
      },
      "");
}
CLI::Validator output_folder() { return writable(true); }

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
