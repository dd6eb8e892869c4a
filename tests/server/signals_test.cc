// The termination-signal watcher: a blocked SIGTERM reaches its callback on the watcher's
// thread, and once the watcher is destroyed (joined) no callback runs, so the callback may use
// objects that die right after it. Run under AddressSanitizer this is the rank-exit lifetime.
#include "server/signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

namespace gcmoe::server {
namespace {

using std::chrono::milliseconds;

struct Target {
  std::atomic<int> signals{0};
  std::atomic<int> last{0};
};

bool WaitFor(const std::atomic<int>& value, int want) {
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(5000);
  while (value.load() < want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  return value.load() >= want;
}

TEST(SignalsTest, SignalsReachTheCallbackAndNoneAfterTheWatcherIsGone) {
  BlockTerminationSignals();
  auto target = std::make_unique<Target>();
  Target* t = target.get();
  {
    TerminationSignalWatcher watcher([t](int signo) {
      t->last = signo;
      ++t->signals;
    });
    kill(getpid(), SIGTERM);
    ASSERT_TRUE(WaitFor(t->signals, 1));
    EXPECT_EQ(t->last.load(), SIGTERM);
    kill(getpid(), SIGINT);
    ASSERT_TRUE(WaitFor(t->signals, 2));
    EXPECT_EQ(t->last.load(), SIGINT);
  }
  // The watcher is joined: its callback's target can go now, and a later signal stays pending
  // (blocked) instead of reaching a destroyed object.
  target.reset();
  kill(getpid(), SIGTERM);
  std::this_thread::sleep_for(milliseconds(50));
  sigset_t pending;
  sigpending(&pending);
  EXPECT_EQ(sigismember(&pending, SIGTERM), 1);
  // Consume it so that the test process does not end with a pending SIGTERM.
  {
    std::atomic<int> drained{0};
    TerminationSignalWatcher watcher([&drained](int) { ++drained; });
    EXPECT_TRUE(WaitFor(drained, 1));
  }
}

}  // namespace
}  // namespace gcmoe::server
