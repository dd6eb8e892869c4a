// SIGTERM/SIGINT as an event: blocked in every thread and received by one watcher thread, so no
// signal handler ever runs arbitrary code.
#pragma once

#include <functional>
#include <thread>

namespace gcmoe::server {

// Call first thing in main, before any thread starts (threads inherit the mask). SIGPIPE is
// ignored: a peer closing a socket is an error return, not a process kill.
void BlockTerminationSignals();
// Restores the default mask; call in a forked child before exec.
void UnblockTerminationSignals();

// A thread that calls on_signal(signo) for each SIGTERM/SIGINT received, for as long as this
// object lives. The destructor stops and joins it: declare the watcher after everything
// on_signal uses, so that it is destroyed first and never calls into a destroyed object.
class TerminationSignalWatcher {
 public:
  explicit TerminationSignalWatcher(std::function<void(int)> on_signal);
  ~TerminationSignalWatcher();
  TerminationSignalWatcher(const TerminationSignalWatcher&) = delete;
  TerminationSignalWatcher& operator=(const TerminationSignalWatcher&) = delete;

 private:
  void Loop();

  std::function<void(int)> on_signal_;
  int signal_fd_ = -1;  // the blocked signals, as a readable descriptor
  int stop_fd_ = -1;    // an eventfd the destructor writes to end Loop
  std::thread thread_;
};

}  // namespace gcmoe::server
