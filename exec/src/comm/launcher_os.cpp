// The launcher's store socket (127.0.0.1 only) and its stop signals.
#include "launcher_os.h"

#include <zeroplan/exec/launcher.h>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace zeroplan::exec::detail {

namespace {
constexpr std::array<int, 3> kStopSignals{SIGTERM, SIGINT, SIGHUP};
std::atomic<int> g_stop_signal{0};
extern "C" void remember_stop_signal(int sig) { g_stop_signal.store(sig); }
}  // namespace

int loopback_listener() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw LaunchError(fmt::format("cannot open a socket for the store: {}", std::strerror(errno)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    ::close(fd);
    throw LaunchError(fmt::format("cannot listen on 127.0.0.1 for the store: {}", std::strerror(err)));
  }
  return fd;
}

int bound_port(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw LaunchError(fmt::format("cannot read the store's port: {}", std::strerror(errno)));
  return ntohs(a.sin_port);
}

StopSignals::StopSignals() {
  g_stop_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = remember_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (std::size_t i = 0; i < kStopSignals.size(); ++i) sigaction(kStopSignals[i], &sa, &old_[i]);
}

StopSignals::~StopSignals() {
  for (std::size_t i = 0; i < kStopSignals.size(); ++i) sigaction(kStopSignals[i], &old_[i], nullptr);
}

int stop_signal() { return g_stop_signal.load(); }

}  // namespace zeroplan::exec::detail
