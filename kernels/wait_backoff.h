// The backoff of the roles' spin waits on global flags (WaitAtLeast, WaitFlagInline): how long a
// waiting thread sleeps after each poll that missed. Host and device, so that a CPU test checks
// the schedule.
//
// It doubles from 32 ns, up to 512 ns for the first kShortWaitSpins polls (some tens of µs: the
// waits of the default path, role2 behind role1 on one GPU, end sooner), then up to the long cap
// (LayerParams::wait_sleep_ns: engine.cuda.wait_sleep_cap_ns, 4096 ns by default). With 512 ns
// for every wait, the hundreds of role2 CTAs polling the ring flags slowed a role1 of few CTAs
// about 40-fold: a 4-SM dispatch partition took 22-31 ms a step at GLM-5.2 T = 256 (role1 alone:
// 0.55 ms), 0.7 ms with the long cap, while the default path's times did not move.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace gcmoe::kernels {

inline constexpr uint32_t kFirstWaitSleepNs = 32;
inline constexpr uint32_t kShortWaitSleepNs = 512;
inline constexpr uint32_t kShortWaitSpins = 32;
inline constexpr uint32_t kDefaultWaitSleepNs = 4096;

// The sleep after poll `spin` (1, 2, ...) missed, given the sleep before it. The long cap is at
// least kShortWaitSleepNs (engine.cuda.wait_sleep_cap_ns has it as its floor).
GCMOE_HOST_DEVICE constexpr uint32_t NextWaitSleep(uint32_t sleep_ns, uint32_t spin,
                                                   uint32_t long_cap_ns) {
  const uint32_t cap = spin < kShortWaitSpins ? kShortWaitSleepNs : long_cap_ns;
  if (sleep_ns >= cap) return sleep_ns;
  return 2 * sleep_ns < cap ? 2 * sleep_ns : cap;
}

}  // namespace gcmoe::kernels
