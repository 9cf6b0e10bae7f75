// The launcher's operating-system pieces: a store socket on loopback only, and the stop signals.
#pragma once

#include <signal.h>

#include <array>

namespace zeroplan::exec::detail {

// A listening socket on 127.0.0.1 only (port chosen by the kernel) for the store to take over: the run
// is local by construction, so no other machine can reach its keys. Throws LaunchError.
int loopback_listener();
int bound_port(int fd);

// SIGTERM, SIGINT and SIGHUP while an object lives: remembered (the handler does nothing else) for the
// launcher's watch loop to forward; the previous handlers restored when it goes.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  std::array<struct sigaction, 3> old_{};
};

// The signal received since the StopSignals object was made, 0 if none.
int stop_signal();

}  // namespace zeroplan::exec::detail
