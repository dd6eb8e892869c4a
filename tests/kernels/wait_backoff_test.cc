// The spin waits' backoff schedule (kernels/wait_backoff.h), stepped as the wait loops step it,
// against the schedule written out by hand.
#include "kernels/wait_backoff.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace gcmoe::kernels {
namespace {

// The sleeps of polls 1..n of one wait, as WaitAtLeast and WaitFlagInline take them.
std::vector<uint32_t> Sleeps(int n, uint32_t long_cap_ns) {
  std::vector<uint32_t> sleeps;
  uint32_t sleep_ns = kFirstWaitSleepNs;
  for (uint32_t spin = 1; sleeps.size() < static_cast<size_t>(n); ++spin) {
    sleeps.push_back(sleep_ns);
    sleep_ns = NextWaitSleep(sleep_ns, spin, long_cap_ns);
  }
  return sleeps;
}

TEST(WaitBackoff, ShortWaitsKeepTheShortCapThenTheLongCapApplies) {
  const std::vector<uint32_t> sleeps = Sleeps(40, kDefaultWaitSleepNs);
  // 32, 64, 128, 256, then 512 up to the 32nd poll; 1024, 2048, 4096 and 4096 after it.
  const std::vector<uint32_t> expected = {32,  64,  128,  256,  512,  512,  512,  512,  512,  512,
                                          512, 512, 512,  512,  512,  512,  512,  512,  512,  512,
                                          512, 512, 512,  512,  512,  512,  512,  512,  512,  512,
                                          512, 512, 1024, 2048, 4096, 4096, 4096, 4096, 4096, 4096};
  EXPECT_EQ(sleeps, expected);
}

TEST(WaitBackoff, ALongCapThatIsNoPowerOfTwoIsReachedNotPassed) {
  const std::vector<uint32_t> sleeps = Sleeps(40, 3000);
  EXPECT_EQ(sleeps[32], 1024u);
  EXPECT_EQ(sleeps[33], 2048u);
  EXPECT_EQ(sleeps[34], 3000u);
  EXPECT_EQ(sleeps[39], 3000u);
}

TEST(WaitBackoff, ACapAtTheShortCapIsTheOldSchedule) {
  // engine.cuda.wait_sleep_cap_ns 512 (its floor): every wait backs off to 512 ns and stays
  // there.
  const std::vector<uint32_t> sleeps = Sleeps(100, kShortWaitSleepNs);
  for (size_t i = 4; i < sleeps.size(); ++i) EXPECT_EQ(sleeps[i], 512u) << "poll " << i + 1;
}

}  // namespace
}  // namespace gcmoe::kernels
