// The one error type of zeroplan: every error it raises for a user is an Error with a kind, and the
// command line maps kinds to its documented exit codes in one place (cli/src/app.cpp: exit_code).
#pragma once

#include <stdexcept>
#include <string>

namespace zeroplan {

// What went wrong, for the exit code: the user's input (1), a feature or device this machine or build
// lacks (2), a run that started and failed (3), a launcher stopped by a signal (128 + N), or an error
// of zeroplan itself (3).
enum class ErrorKind { bad_input, not_possible_here, run_failed, interrupted, internal };

// what() is one line, ready to print. Broken invariants are assertions, never an Error.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Bad input a user can cause: a bad file, plan, unknown cluster name (bad_input).
class SchemaError : public Error {
 public:
  explicit SchemaError(const std::string& message) : Error(ErrorKind::bad_input, message) {}
};

}  // namespace zeroplan
