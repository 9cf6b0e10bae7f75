#include "zeroplan/profiles/json_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "json_util.h"

namespace zeroplan {

namespace {

std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s;
}

std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw SchemaError(file.string() + ": cannot open: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw SchemaError(file.string() + ": cannot read");
  return text.str();
}

template <class T>
T from_parsed(const nlohmann::json& j, const std::filesystem::path& base_dir, const std::string& origin) {
  T document;
  if constexpr (std::is_same_v<T, ClusterProfile>) {
    read_resolved_cluster(resolve_cluster_extends(j, base_dir, origin), document);
  } else {
    (void)base_dir;
    (void)origin;
    from_json(j, document);
  }
  return document;
}

template <class T>
T convert(const nlohmann::json& j, const std::filesystem::path& base_dir, const std::string& origin) {
  try {
    return from_parsed<T>(j, base_dir, origin);
  } catch (const SchemaError& e) {
    const std::string message = e.what();
    if (message.rfind(origin + ":", 0) == 0) throw;  // already names it (a nested extends)
    throw SchemaError(origin + ": " + message);
  } catch (const nlohmann::json::exception& e) {
    throw SchemaError(origin + ": " + one_line(e.what()));
  }
}

}  // namespace

nlohmann::json parse_json_text(const std::string& text, const std::string& origin) {
  constexpr int kMaxJsonDepth = 64;
  // JSON allows a repeated key and keeps the last one; a document with one is almost surely a mistake.
  std::vector<std::set<std::string>> keys_per_object;
  std::string last_key;  // names the field when a number is out of range
  auto reject_duplicates = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    // No zeroplan document nests deeper than a few levels; a bound keeps copies and destruction (which
    // recurse) from overflowing the stack on a hostile file.
    if ((event == Event::object_start || event == Event::array_start) && depth >= kMaxJsonDepth)
      throw SchemaError(origin + ": nested deeper than " + std::to_string(kMaxJsonDepth) + " levels" +
                        (last_key.empty() ? std::string() : " (under " + quote_json(last_key) + ")"));
    if (event == Event::object_start) {
      keys_per_object.emplace_back();
    } else if (event == Event::object_end) {
      keys_per_object.pop_back();
    } else if (event == Event::key && !keys_per_object.empty()) {
      const std::string key = parsed.get<std::string>();
      last_key = key;
      if (!keys_per_object.back().insert(key).second)
        throw SchemaError(origin + ": duplicate key " + quote_json(key));
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, reject_duplicates);
  } catch (const nlohmann::json::out_of_range& e) {
    // e.g. 1e999: "[json.exception.out_of_range.406] number overflow parsing '1e999'"
    std::string what = e.what();
    if (const std::size_t close = what.find("] "); close != std::string::npos) what = what.substr(close + 2);
    throw SchemaError(origin + ": " + one_line(what) +
                      (last_key.empty() ? std::string() : " (the value of " + quote_json(last_key) + ")"));
  } catch (const nlohmann::json::parse_error& e) {
    // Line and column of the byte where parsing failed (e.byte is 1-based).
    std::size_t line = 1, column = 1;
    const std::size_t end = std::min(text.size(), e.byte > 0 ? e.byte - 1 : 0);
    for (std::size_t i = 0; i < end; ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    std::string what = e.what();
    const std::size_t column_at = what.find("column ");
    const std::size_t colon = column_at == std::string::npos ? what.find("] ") : what.find(": ", column_at);
    if (colon != std::string::npos) what = what.substr(colon + 2);
    throw SchemaError(origin + ":" + std::to_string(line) + ":" + std::to_string(column) +
                      ": invalid JSON: " + one_line(what));
  }
}

nlohmann::json parse_json_file(const std::filesystem::path& file) {
  return parse_json_text(read_text(file), file.string());
}

template <class T>
T read_document(const std::filesystem::path& file) {
  const nlohmann::json j = parse_json_file(file);
  return convert<T>(j, file.parent_path(), file.string());
}

template <class T>
T parse_document(const std::string& text, const std::string& origin) {
  return convert<T>(parse_json_text(text, origin), std::filesystem::current_path(), origin);
}

template <class T>
std::string to_json_string(const T& document) {
  return to_ordered_json(document).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

namespace {
// The temporary file written beside `target` before it replaces it (and check_output's probe).
std::filesystem::path temp_beside(const std::filesystem::path& target) {
  const std::filesystem::path dir = target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path();
  return dir / ("." + target.filename().string() + ".tmp." + std::to_string(static_cast<long>(::getpid())));
}

// Writes `bytes` to `to` (named `file` in errors), flushed.
void write_bytes(const std::filesystem::path& file, const std::filesystem::path& to, std::string_view bytes) {
  std::FILE* out = std::fopen(to.c_str(), "wb");
  if (out == nullptr) throw SchemaError(file.string() + ": cannot write: " + std::strerror(errno));
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), out) == bytes.size() && std::fflush(out) == 0;
  const int write_errno = errno;
  if (std::fclose(out) != 0 || !written)
    throw SchemaError(file.string() + ": cannot write: " + std::strerror(written ? errno : write_errno));
}
}  // namespace

template <class T>
void write_document(const std::filesystem::path& file, const T& document) {
  try {
    validate(document);
  } catch (const SchemaError& e) {
    throw SchemaError(file.string() + ": not written: " + e.what());
  }
  const std::string text = to_json_string(document);
  const std::filesystem::path target = output_target(file);
  std::error_code status_ec;
  const auto status = std::filesystem::status(target, status_ec);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    // A device, a pipe or a socket is written in place, never replaced.
    write_bytes(file, target, text);
    return;
  }
  write_file_atomically(file, target, text);
}

void write_file_atomically(const std::filesystem::path& file, const std::filesystem::path& target,
                           const std::function<void(const std::filesystem::path& temp)>& fill) {
  const std::filesystem::path temp = temp_beside(target);
  auto cannot = [&](const std::string& what) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    throw SchemaError(file.string() + ": cannot write: " + what);
  };
  try {
    fill(temp);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    throw;
  }
  const int fd = ::open(temp.c_str(), O_RDONLY);
  if (fd < 0) cannot(std::strerror(errno));
  const bool synced = ::fsync(fd) == 0;
  const int sync_errno = errno;
  ::close(fd);
  if (!synced) cannot(std::strerror(sync_errno));
  std::error_code ec;
  std::filesystem::rename(temp, target, ec);
  if (ec) cannot(ec.message());
  // The rename on disk too (best effort: a folder this process cannot open keeps the file all the same).
  const std::filesystem::path dir = temp.parent_path();
  if (const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY); dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void write_file_atomically(const std::filesystem::path& file, const std::filesystem::path& target,
                           std::string_view bytes) {
  write_file_atomically(file, target, [&](const std::filesystem::path& temp) { write_bytes(file, temp, bytes); });
}

std::filesystem::path output_target(const std::filesystem::path& file) {
  // A symlink is followed (its target is written, the link stays); a missing tail is kept as given.
  std::error_code ec;
  const std::filesystem::path resolved = std::filesystem::weakly_canonical(file, ec);
  return ec ? file : resolved;
}

void check_output(const std::filesystem::path& file) {
  if (file.empty()) throw SchemaError("output path is empty");
  const std::filesystem::path target = output_target(file);
  std::error_code ec;
  const auto status = std::filesystem::status(target, ec);
  if (std::filesystem::is_directory(status)) throw SchemaError(file.string() + ": cannot write: it is a directory");
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    if (::access(target.c_str(), W_OK) != 0) throw SchemaError(file.string() + ": cannot write: " + std::strerror(errno));
    return;  // a device or a pipe: written in place
  }
  const std::filesystem::path dir = target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path();
  if (!std::filesystem::is_directory(dir, ec))
    throw SchemaError(file.string() + ": cannot write: no folder " + dir.string());
  // Create (and remove) the temporary file write_document would: the only test that holds for root, for
  // read-only mounts and for pseudo-filesystems such as /proc.
  const std::filesystem::path probe = temp_beside(target);
  std::FILE* out = std::fopen(probe.c_str(), "wb");
  if (out == nullptr) throw SchemaError(file.string() + ": cannot write: " + std::strerror(errno));
  std::fclose(out);
  std::filesystem::remove(probe, ec);
}

std::string schema_of(const nlohmann::json& j) {
  if (j.is_object()) {
    const auto it = j.find("schema");
    if (it != j.end() && it->is_string()) return it->get<std::string>();
  }
  return "";
}

#define ZEROPLAN_DOCUMENT(T)                                                        \
  template T read_document<T>(const std::filesystem::path&);                        \
  template T parse_document<T>(const std::string&, const std::string&);             \
  template std::string to_json_string<T>(const T&);                                 \
  template void write_document<T>(const std::filesystem::path&, const T&);

ZEROPLAN_DOCUMENT(ModelProfile)
ZEROPLAN_DOCUMENT(ClusterProfile)
ZEROPLAN_DOCUMENT(Plan)
ZEROPLAN_DOCUMENT(Prediction)
ZEROPLAN_DOCUMENT(RunRecord)
ZEROPLAN_DOCUMENT(Comparison)

#undef ZEROPLAN_DOCUMENT

}  // namespace zeroplan
