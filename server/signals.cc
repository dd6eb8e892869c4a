#include "server/signals.h"

#include <pthread.h>
#include <signal.h>

#include <thread>

namespace gcmoe::server {
namespace {

sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

sigset_t ReloadSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGHUP);
  return set;
}

sigset_t BlockedSet() {
  sigset_t set = TerminationSet();
  sigaddset(&set, SIGHUP);
  return set;
}

}  // namespace

void BlockTerminationSignals() {
  const sigset_t set = BlockedSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

void UnblockTerminationSignals() {
  const sigset_t set = BlockedSet();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_DFL);
}

void WatchTerminationSignals(std::function<void(int)> on_signal) {
  std::thread([on_signal = std::move(on_signal)] {
    const sigset_t set = TerminationSet();
    for (;;) {
      int signo = 0;
      if (sigwait(&set, &signo) == 0) on_signal(signo);
    }
  }).detach();
}

void WatchReloadSignal(std::function<void()> on_reload) {
  std::thread([on_reload = std::move(on_reload)] {
    const sigset_t set = ReloadSet();
    for (;;) {
      int signo = 0;
      if (sigwait(&set, &signo) == 0) on_reload();
    }
  }).detach();
}

}  // namespace gcmoe::server
