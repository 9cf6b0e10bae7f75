#include "errors.h"

#include <algorithm>
#include <sstream>

namespace zeroplan::exec::detail {

std::string first_line(const std::string& message) {
  std::istringstream in(message);
  std::string line;
  while (std::getline(in, line)) {
    auto begin = line.find_first_not_of(" \t\r");
    if (begin == std::string::npos) continue;
    auto end = line.find_last_not_of(" \t\r");
    size_t length = std::min<size_t>(end - begin + 1, 400);
    std::string out(line, begin, length);
    if (length < end - begin + 1) out.replace(out.size() - 3, 3, "...");
    return out;
  }
  return "unknown error";
}

}  // namespace zeroplan::exec::detail
