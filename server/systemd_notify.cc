#include "server/systemd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

namespace gcmoe::server {

bool NotifySystemd(const std::string& state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const size_t length = std::strlen(path);
  if (length >= sizeof(address.sun_path)) return false;
  std::memcpy(address.sun_path, path, length);
  // A leading '@' names a socket in the abstract namespace, whose name starts with a NUL.
  if (address.sun_path[0] == '@') address.sun_path[0] = '\0';
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const socklen_t address_length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + length);
  const ssize_t sent = sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                              reinterpret_cast<const sockaddr*>(&address), address_length);
  close(fd);
  return sent == static_cast<ssize_t>(state.size());
}

std::chrono::microseconds SystemdWatchdogPeriod() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  if (usec == nullptr) return std::chrono::microseconds(0);
  // systemd sets WATCHDOG_PID to the main process; a child that inherited the variables must
  // not answer for it.
  if (const char* pid = std::getenv("WATCHDOG_PID"); pid != nullptr) {
    if (std::strtoll(pid, nullptr, 10) != static_cast<long long>(getpid())) {
      return std::chrono::microseconds(0);
    }
  }
  const long long value = std::strtoll(usec, nullptr, 10);
  return std::chrono::microseconds(value > 0 ? value : 0);
}

SystemdWatchdog::SystemdWatchdog(std::function<bool()> alive) {
  const std::chrono::microseconds period = SystemdWatchdogPeriod();
  if (period.count() == 0) return;
  spdlog::info("systemd watchdog: a keep-alive every {} ms", period.count() / 2000);
  thread_ = std::thread([this, period, alive = std::move(alive)] {
    const auto step = std::chrono::milliseconds(50);
    auto next = std::chrono::steady_clock::now();
    while (!stop_.load()) {
      if (std::chrono::steady_clock::now() >= next) {
        if (alive()) NotifySystemd("WATCHDOG=1");
        next = std::chrono::steady_clock::now() + period / 2;
      }
      std::this_thread::sleep_for(step);
    }
  });
}

SystemdWatchdog::~SystemdWatchdog() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

}  // namespace gcmoe::server
