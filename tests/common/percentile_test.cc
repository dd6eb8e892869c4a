// The nearest-rank percentile against values worked out by hand from its definition (the
// smallest sample with at least a fraction q of the samples at or below it).
#include "common/percentile.h"

#include <vector>

#include <gtest/gtest.h>

namespace gcmoe {
namespace {

TEST(NearestRankPercentile, HundredSamples) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_EQ(NearestRankPercentile<double>(v, 0.5), 50);
  EXPECT_EQ(NearestRankPercentile<double>(v, 0.9), 90);
  EXPECT_EQ(NearestRankPercentile<double>(v, 0.99), 99);
  EXPECT_EQ(NearestRankPercentile<double>(v, 1.0), 100);
  EXPECT_EQ(NearestRankPercentile<double>(v, 0.0), 1);
}

TEST(NearestRankPercentile, FewSamplesAndNone) {
  const std::vector<float> four = {1, 2, 3, 4};
  EXPECT_EQ(NearestRankPercentile<float>(four, 0.5), 2);   // 2 of 4 at or below
  EXPECT_EQ(NearestRankPercentile<float>(four, 0.51), 3);  // 2.04 of 4: the third
  EXPECT_EQ(NearestRankPercentile<float>(std::vector<float>{7}, 0.99), 7);
  EXPECT_EQ(NearestRankPercentile<double>(std::vector<double>{}, 0.5), 0.0);
}

}  // namespace
}  // namespace gcmoe
