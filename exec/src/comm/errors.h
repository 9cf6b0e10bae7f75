// Private helpers for turning c10d's multi-line errors into the one line zeroplan reports.
#pragma once

#include <string>

namespace zeroplan::exec::detail {

// The first non-empty line of a c10/c10d error message, trimmed and capped at 400 characters.
std::string first_line(const std::string& message);

}  // namespace zeroplan::exec::detail
