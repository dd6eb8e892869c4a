#include "balancer/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "test_instances.h"

namespace gcmoe::balancer {
namespace {

using testing::Rng;

TEST(PlacementTest, HandPackedExample) {
  // Heaviest first onto the lightest rank with room (2 per rank):
  //   e0 (10) -> r0; e1 (7) -> r1; e2 (5) -> r1 (7 < 10); e3 (1) -> r0 (r1 is full).
  // Each rank's heaviest expert gets its copy on ring neighbour 0 (the next rank).
  const Placement p = FitPlacement(std::vector<double>{10, 7, 5, 1}, MakeRing(2).value(), 1).value();
  EXPECT_EQ(p.home, (std::vector<int>{0, 1, 1, 0}));
  EXPECT_EQ(p.host, (std::vector<int>{1, 0, -1, -1}));
}

TEST(PlacementTest, SecondHeaviestUsesTheSecondNeighbour) {
  // 2x2 torus, 8 experts, 2 per rank; loads descend with the id.
  std::vector<double> load = {80, 70, 60, 50, 40, 30, 20, 10};
  const Topology torus = MakeTorus(2, 2).value();
  const Placement p = FitPlacement(load, torus, 2).value();
  for (int r = 0; r < 4; ++r) {
    std::vector<int> mine;
    for (int e = 0; e < 8; ++e) {
      if (p.home[e] == r) mine.push_back(e);
    }
    ASSERT_EQ(mine.size(), 2u);
    // Ids ascend as loads descend: the lower id is the heavier.
    EXPECT_EQ(p.host[mine[0]], torus.Neighbour(r, 0));
    EXPECT_EQ(p.host[mine[1]], torus.Neighbour(r, 1));
  }
}

TEST(PlacementTest, PaddingLeavesSomeRanksOneShort) {
  const Placement p = FitPlacement(std::vector<double>{5, 4, 3, 2, 1}, MakeRing(2).value(), 0).value();
  std::vector<int> count(2, 0);
  for (int h : p.home) ++count[h];
  std::sort(count.begin(), count.end());
  EXPECT_EQ(count, (std::vector<int>{2, 3}));
  for (int e = 0; e < 5; ++e) EXPECT_FALSE(p.replicated(e));
}

TEST(PlacementTest, PropertiesOnRandomLoads) {
  Rng rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int g = std::vector<int>{4, 8, 16, 32, 64}[trial % 5];
    const Topology topology = trial % 3 == 0 && g >= 4 ? MakeRing(g).value() : DefaultTopology(g).value();
    const int e_count = rng.Uniform(1, 4 * g + 3);
    const int d = rng.Uniform(0, topology.degree());
    std::vector<double> load;
    const Placement p = testing::TopologyPlacement(rng, topology, e_count, d, &load);
    ASSERT_TRUE(p.Validate().ok());
    const int capacity = (e_count + g - 1) / g;
    std::vector<std::vector<int>> on_rank(g);
    for (int e = 0; e < e_count; ++e) on_rank[p.home[e]].push_back(e);
    for (int r = 0; r < g; ++r) {
      ASSERT_LE(static_cast<int>(on_rank[r].size()), capacity);
      // The replicated experts are the rank's min(D, n) heaviest, the d-th on neighbour d.
      std::vector<int> mine = on_rank[r];
      std::stable_sort(mine.begin(), mine.end(), [&](int a, int b) { return load[a] > load[b]; });
      for (size_t i = 0; i < mine.size(); ++i) {
        if (static_cast<int>(i) < d) {
          EXPECT_EQ(p.host[mine[i]], topology.Neighbour(r, static_cast<int>(i)));
        } else {
          EXPECT_EQ(p.host[mine[i]], -1);
        }
      }
    }
  }
}

TEST(PlacementTest, RejectsBadInput) {
  const Topology ring = MakeRing(4).value();
  EXPECT_FALSE(FitPlacement(std::vector<double>{1, 2, 3, 4}, ring, 3).ok());  // ring degree 2
  EXPECT_FALSE(FitPlacement(std::vector<double>{1, -2, 3, 4}, ring, 1).ok());
  EXPECT_FALSE(FitPlacement(std::vector<double>{}, ring, 1).ok());
}

}  // namespace
}  // namespace gcmoe::balancer
