// systemd's service notification protocol (sd_notify(3)): READY, STATUS, STOPPING and the
// watchdog keep-alive, sent as datagrams to the socket systemd names in $NOTIFY_SOCKET. Spoken
// directly, so the binary and its images need no libsystemd. Outside a Type=notify unit the
// variables are unset and every call does nothing.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

namespace gcmoe::server {

// Sends one notification ("READY=1", "STATUS=...", several joined by '\n'). True when sent;
// false when not run by systemd or the socket refused it.
bool NotifySystemd(const std::string& state);

// The keep-alive period systemd expects ($WATCHDOG_USEC when $WATCHDOG_PID is this process or
// unset), or zero when the unit has no WatchdogSec.
std::chrono::microseconds SystemdWatchdogPeriod();

// Sends WATCHDOG=1 at half the period while `alive()` returns true; a call of `alive` that hangs
// (a deadlocked coordinator) stops the keep-alives, and systemd restarts the service.
class SystemdWatchdog {
 public:
  explicit SystemdWatchdog(std::function<bool()> alive);
  ~SystemdWatchdog();

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace gcmoe::server
