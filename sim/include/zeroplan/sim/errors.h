// Errors a user can cause in the simulator (a plan or profile that cannot be simulated). Each carries a
// one-line message starting with "simulate: ". Broken invariants are assertions, not these.
#pragma once

#include <stdexcept>
#include <string>

namespace zeroplan::sim {

class SimError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
