// Waiting for another thread's word without paying a sleeping thread's wake-up: on the service's
// hot path (a rank's next step, a coordinator's step results) a thread spins for a while,
// yielding its core, before it blocks, so that an answer that comes within the budget is seen
// in about a microsecond instead of after a futex wake-up (tens of microseconds on a core that
// has gone idle).
#pragma once

#include <chrono>
#include <string_view>
#include <thread>

namespace gcmoe {

// How long the hot path spins before it blocks: the gap between a caller's steps at one call in
// flight (its round trip through gRPC) is a few hundred microseconds.
inline constexpr std::chrono::microseconds kHotPathSpin{1000};

// The spin budget server.spin_wait ("auto", "on", "off") gives a service on `backend`: "auto"
// spins with the cuda backend only (the cpu backend's compute needs every core).
inline std::chrono::microseconds HotPathSpinBudget(std::string_view spin_wait,
                                                   std::string_view backend) {
  const bool on = spin_wait == "on" || (spin_wait == "auto" && backend == "cuda");
  return on ? kHotPathSpin : std::chrono::microseconds(0);
}

// Calls ready() until it returns true (then true) or `budget` has passed (then false), yielding
// the core between calls; with no budget it calls ready() once.
template <typename Ready>
bool SpinUntil(Ready&& ready, std::chrono::microseconds budget) {
  if (budget.count() <= 0) return ready();
  const auto end = std::chrono::steady_clock::now() + budget;
  for (unsigned i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 31) == 31 && std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::yield();
  }
}

}  // namespace gcmoe
