// Private text helpers shared by the tuner's sources: numbers, bytes and names in messages and reports.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zeroplan::tuner::text {

// "1.50 GiB", "312.0 MiB", "512 B": binary units, fixed precision (deterministic).
std::string bytes(std::int64_t b);
// "1.234 s", "12.3 ms", "45.6 us".
std::string seconds(double s);
// Signed relative change "+3.2%" / "-0.4%".
std::string percent(double relative);
// Shortest representation that reads back to the same double (like JSON writers).
std::string num(double v);
// Levenshtein distance and the closest of `candidates` within max(2, len/3), or "".
std::size_t edit_distance(std::string_view a, std::string_view b);
std::string closest(std::string_view word, const std::vector<std::string>& candidates);
// "a, b, c".
std::string join(const std::vector<std::string>& items, std::string_view sep = ", ");
// Escapes &, <, >, " for HTML text and attributes.
std::string html_escape(std::string_view s);

}  // namespace zeroplan::tuner::text
