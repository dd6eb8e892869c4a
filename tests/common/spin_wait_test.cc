#include "common/spin_wait.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace gcmoe {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(SpinWaitTest, AutoSpinsForTheCudaBackendOnly) {
  EXPECT_EQ(HotPathSpinBudget("auto", "cuda"), kHotPathSpin);
  EXPECT_EQ(HotPathSpinBudget("auto", "cpu"), microseconds(0));
  EXPECT_EQ(HotPathSpinBudget("on", "cpu"), kHotPathSpin);
  EXPECT_EQ(HotPathSpinBudget("off", "cuda"), microseconds(0));
}

TEST(SpinWaitTest, SeesAWordSetByAnotherThreadWithinTheBudget) {
  std::atomic<bool> ready{false};
  std::thread setter([&ready] {
    std::this_thread::sleep_for(milliseconds(2));
    ready.store(true, std::memory_order_release);
  });
  // A budget far longer than the setter's delay: the spin ends when the word is set.
  const auto start = Clock::now();
  EXPECT_TRUE(SpinUntil([&ready] { return ready.load(std::memory_order_acquire); },
                        microseconds(10'000'000)));
  EXPECT_GE(Clock::now() - start, milliseconds(1));
  setter.join();
}

TEST(SpinWaitTest, GivesUpOnceTheBudgetHasPassed) {
  int calls = 0;
  const auto start = Clock::now();
  EXPECT_FALSE(SpinUntil([&calls] { return ++calls < 0; }, microseconds(2000)));
  EXPECT_GE(Clock::now() - start, microseconds(2000));
  EXPECT_GT(calls, 1);
}

TEST(SpinWaitTest, NoBudgetAsksOnce) {
  int calls = 0;
  EXPECT_FALSE(SpinUntil([&calls] { return ++calls < 0; }, microseconds(0)));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(SpinUntil([] { return true; }, microseconds(0)));
}

}  // namespace
}  // namespace gcmoe
