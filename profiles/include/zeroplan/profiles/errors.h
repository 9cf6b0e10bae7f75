// Errors a user can cause with a bad document (bad file, bad plan, unknown cluster name).
#pragma once

#include <stdexcept>
#include <string>

namespace zeroplan {

// Bad input a user can cause. what() is one line, ready to print; the CLI maps it to exit code 1.
// Broken invariants are assertions, never SchemaError.
class SchemaError : public std::runtime_error {
 public:
  explicit SchemaError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace zeroplan
