#include "server/signals.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace gcmoe::server {
namespace {

sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

void BlockTerminationSignals() {
  const sigset_t set = TerminationSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

void UnblockTerminationSignals() {
  const sigset_t set = TerminationSet();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_DFL);
}

TerminationSignalWatcher::TerminationSignalWatcher(std::function<void(int)> on_signal)
    : on_signal_(std::move(on_signal)) {
  const sigset_t set = TerminationSet();
  // The signals stay blocked (BlockTerminationSignals), so they queue for this descriptor
  // instead of running a handler.
  signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC);
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  thread_ = std::thread([this] { Loop(); });
}

TerminationSignalWatcher::~TerminationSignalWatcher() {
  const uint64_t one = 1;
  if (stop_fd_ >= 0) {
    while (write(stop_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }
  thread_.join();
  if (signal_fd_ >= 0) close(signal_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

void TerminationSignalWatcher::Loop() {
  if (signal_fd_ < 0 || stop_fd_ < 0) return;
  for (;;) {
    pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info{};
      if (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
        on_signal_(static_cast<int>(info.ssi_signo));
      }
    }
  }
}

}  // namespace gcmoe::server
