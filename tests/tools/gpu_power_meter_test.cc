// PowerWindow against hand-computed averages of synthetic counter readings; GpuPowerMeter's
// refusal when it cannot reach a GPU.
#include "tools/gpu_power_meter.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace gcmoe::tools {
namespace {

TEST(PowerWindow, AveragesBetweenTheFirstAndLastCounterUpdate) {
  // A 700 W board whose counter updates every 50 ms, read every 7 ms from 2.5 ms on: readings
  // before the first update and after the last one must not count, since the counter had not
  // moved for them.
  PowerWindow window;
  const double update_s = 0.050;
  const double watts = 700.0;
  const uint64_t base_mj = 123456789;
  for (int i = 0; i <= 68; ++i) {  // 2.5 .. 478.5 ms
    const double t = 0.0025 + 0.007 * i;
    const uint64_t updates = static_cast<uint64_t>(t / update_s);
    window.Add(t, base_mj + static_cast<uint64_t>(updates * update_s * watts * 1000.0 + 0.5),
               1700 + 10 * (i % 3));
  }
  // The first update (50 ms) is seen at 51.5 ms, the last (450 ms) at 450.5 ms: 8 updates of
  // 35 J between them, over 0.399 s of readings.
  EXPECT_NEAR(window.Watts(), 8 * 35.0 / (0.4505 - 0.0515), 1e-9);
  // Clocks 1700, 1710, 1720 repeating over 69 readings.
  EXPECT_NEAR(window.MeanSmMhz(), 1710.0, 1e-9);
}

TEST(PowerWindow, NeedsTwoUpdates) {
  PowerWindow window;
  EXPECT_EQ(window.Watts(), 0.0);
  EXPECT_EQ(window.MeanSmMhz(), 0.0);
  window.Add(0.00, 1000, 0);
  window.Add(0.01, 1000, 0);
  window.Add(0.02, 1500, 0);  // one update: no interval yet
  EXPECT_EQ(window.Watts(), 0.0);
  window.Add(0.03, 1500, 0);
  window.Add(0.07, 2500, 0);  // second update: 1 J over 50 ms
  EXPECT_NEAR(window.Watts(), 20.0, 1e-9);
  EXPECT_EQ(window.MeanSmMhz(), 0.0);  // no clock was read
}

TEST(GpuPowerMeter, RefusesABusWithNoGpu) {
  std::string why;
  auto meter = GpuPowerMeter::Open("0000:FF:1F.7", &why);
  EXPECT_EQ(meter, nullptr);
  EXPECT_FALSE(why.empty());
}

}  // namespace
}  // namespace gcmoe::tools
