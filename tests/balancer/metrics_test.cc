#include "balancer/metrics.h"

#include <gtest/gtest.h>

#include <vector>

namespace gcmoe::balancer {
namespace {

TEST(MetricsTest, SpatialIsMeanOverMax) {
  EXPECT_DOUBLE_EQ(SpatialUtilization(std::vector<int64_t>{2, 4}), 0.75);
  EXPECT_DOUBLE_EQ(SpatialUtilization(std::vector<double>{1.0, 1.0, 1.0, 5.0}), 0.4);
  EXPECT_DOUBLE_EQ(SpatialUtilization(std::vector<int64_t>{0, 0, 0}), 1.0);
}

TEST(MetricsTest, EffectiveUtilizationChargesTheSolve) {
  EXPECT_DOUBLE_EQ(EffectiveUtilization(0.8, 1.0, 100.0), 0.8 / 1.01);
  EXPECT_DOUBLE_EQ(EffectiveUtilization(0.9, 0.0, 100.0), 0.9);
  // LPLB-like: 100 us solve on a 100 us layer halves the balance.
  EXPECT_DOUBLE_EQ(EffectiveUtilization(1.0, 100.0, 100.0), 0.5);
}

TEST(MetricsTest, AttainmentIsARatio) {
  EXPECT_DOUBLE_EQ(Attainment(0.45, 0.5), 0.9);
  EXPECT_DOUBLE_EQ(Attainment(0.5, 0.5), 1.0);
}

}  // namespace
}  // namespace gcmoe::balancer
