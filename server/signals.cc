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

void WatchTerminationSignals(std::function<void(int)> on_signal) {
  std::thread([on_signal = std::move(on_signal)] {
    const sigset_t set = TerminationSet();
    for (;;) {
      int signo = 0;
      if (sigwait(&set, &signo) == 0) on_signal(signo);
    }
  }).detach();
}

}  // namespace gcmoe::server
