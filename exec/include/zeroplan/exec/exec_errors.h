// Errors a user can cause when running a plan (CommError, for dead or hung peers, is in
// communicator.h). what() is one line, ready to print.
#pragma once

#include <cstdint>
#include <string>

#include "zeroplan/profiles/errors.h"

namespace zeroplan::exec {

// A plan or option the executor cannot run (unsupported feature, unknown device, bad numbers): bad_input.
// Its subclasses below are run failures.
class ExecError : public Error {
 public:
  explicit ExecError(const std::string& message) : Error(ErrorKind::bad_input, message) {}

 protected:
  ExecError(ErrorKind kind, const std::string& message) : Error(kind, message) {}
};

// The device pool refused an allocation past --device-memory-limit (or the real device ran out):
// "out of device memory in unit U, phase F: need A bytes, limit L".
class OutOfDeviceMemory : public ExecError {
 public:
  OutOfDeviceMemory(std::string unit, std::string phase, std::int64_t need_bytes, std::int64_t limit_bytes);
  const std::string& unit() const { return unit_; }
  const std::string& phase() const { return phase_; }
  std::int64_t need_bytes() const { return need_bytes_; }
  std::int64_t limit_bytes() const { return limit_bytes_; }

 private:
  std::string unit_;
  std::string phase_;
  std::int64_t need_bytes_;
  std::int64_t limit_bytes_;
};

// Torch refused an operation inside a unit during the run (a model that cannot train at this batch, a
// shape the model does not take): "unit U, phase F (micro batch B): torch: <torch's own cause>".
class UnitFailure : public ExecError {
 public:
  explicit UnitFailure(const std::string& message) : ExecError(ErrorKind::run_failed, message) {}
};

// The run diverged: a non-finite loss on a step that the plan's loss scaling did not skip ("the run
// diverged at step S: loss nan on rank R"). A run failure (exit 3), raised before that step's checkpoint.
class Diverged : public ExecError {
 public:
  explicit Diverged(const std::string& message) : ExecError(ErrorKind::run_failed, message) {}
};

}  // namespace zeroplan::exec
