// "{}" placeholders filled in order through an ostream. (The torch wheel ships fmt 12 headers that
// shadow the system fmt on the include path, so the executor does not use fmt.)
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace zeroplan::exec::detail {

inline void format_into(std::ostringstream& os, std::string_view f) { os << f; }

template <class T, class... Rest>
void format_into(std::ostringstream& os, std::string_view f, const T& value, const Rest&... rest) {
  const auto pos = f.find("{}");
  if (pos == std::string_view::npos) {
    os << f;
    return;
  }
  os << f.substr(0, pos) << value;
  format_into(os, f.substr(pos + 2), rest...);
}

template <class... Args>
std::string format(std::string_view f, const Args&... args) {
  std::ostringstream os;
  format_into(os, f, args...);
  return os.str();
}

}  // namespace zeroplan::exec::detail
