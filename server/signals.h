// SIGTERM/SIGINT (stop) and SIGHUP (reload) as events: blocked in every thread and received by
// one waiter thread each, so no signal handler ever runs arbitrary code.
#pragma once

#include <functional>

namespace gcmoe::server {

// Call first thing in main, before any thread starts (threads inherit the mask). SIGPIPE is
// ignored: a peer closing a socket is an error return, not a process kill.
void BlockTerminationSignals();
// Restores the default mask; call in a forked child before exec.
void UnblockTerminationSignals();
// Starts a thread that calls on_signal(signo) for each SIGTERM/SIGINT received.
void WatchTerminationSignals(std::function<void(int)> on_signal);
// Starts a thread that calls on_reload() for each SIGHUP received. A process that does not
// watch SIGHUP leaves it blocked: a stray SIGHUP does not kill it.
void WatchReloadSignal(std::function<void()> on_reload);

}  // namespace gcmoe::server
