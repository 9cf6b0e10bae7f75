// Errors a user can cause in the simulator (a plan or profile that cannot be simulated). Each carries a
// one-line message starting with "simulate: ". Broken invariants are assertions, not these.
#pragma once

#include <string>

#include "zeroplan/profiles/errors.h"

namespace zeroplan::sim {

// A plan or profile the simulator cannot simulate (bad_input).
class SimError : public Error {
 public:
  explicit SimError(const std::string& message) : Error(ErrorKind::bad_input, message) {}
};

// The dependencies form a cycle; the message names a task on it.
class CycleError : public SimError {
 public:
  using SimError::SimError;
};

// Some task can never start (e.g. queued on its resource behind a task that waits for it).
class DeadlockError : public SimError {
 public:
  using SimError::SimError;
};

}  // namespace zeroplan::sim
