#include <fmt/core.h>

#include <cmath>
#include <filesystem>
#include <optional>
#include <thread>

#include "cli.h"
#include "zeroplan/profiles/cluster.h"
#include "zeroplan/profiles/errors.h"
#include "zeroplan/profiles/json_io.h"

namespace zeroplan::cli {

std::string gib(std::int64_t bytes) { return fmt::format("{:.2f} GiB", bytes / double(1ull << 30)); }

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

namespace {
// The whole of `text` as a number, or nullopt.
std::optional<double> whole_number(const std::string& text) {
  std::size_t used = 0;
  try {
    const double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}
}  // namespace

CLI::Validator number_in(double lo, double hi, bool open_lo) {
  return CLI::Validator(
      [lo, hi, open_lo](std::string& text) -> std::string {
        const std::optional<double> parsed = whole_number(text);
        if (!parsed) return fmt::format("expected a number, got \"{}\"", text);
        const double v = *parsed;
        if (!std::isfinite(v)) return fmt::format("must be a finite number (got {})", text);
        if (open_lo ? !(v > lo) : !(v >= lo)) return fmt::format("must be {} {:g} (got {})", open_lo ? ">" : ">=", lo, text);
        if (v > hi) return fmt::format("must be <= {:g} (got {})", hi, text);
        return "";
      },
      "");
}

// The writes' own check (json_io's check_output: the temporary file write_document makes, created and
// removed there), run when the option is read. A folder is made as needed: its nearest existing ancestor
// must take a file.
CLI::Validator output_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty()) return "is an empty path";
        try {
          check_output(text);
        } catch (const SchemaError& e) {
          return e.what();
        }
        return "";
      },
      "");
}

CLI::Validator output_folder() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        namespace fs = std::filesystem;
        if (text.empty()) return "is an empty path";
        std::error_code ec;
        fs::path dir = fs::absolute(fs::path(text), ec);
        if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) return text + ": cannot write into it: it is a file";
        while (!fs::exists(dir, ec) && dir != dir.root_path()) dir = dir.parent_path();
        try {
          check_output(dir / ".zeroplan-folder-check");
        } catch (const SchemaError& e) {
          return fmt::format("{}: cannot write: {}", text, e.what());
        }
        return "";
      },
      "");
}


CLI::Validator threads_option() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
        const double most = 16.0 * cores;
        const std::optional<double> v = whole_number(text);
        if (!v || *v != std::floor(*v)) return fmt::format("expected a whole number, got \"{}\"", text);
        if (*v < 0 || *v > most)
          return fmt::format("must be 0 (all cores) to {:g} (16 x this machine's {} cores), got {}", most, cores, text);
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
