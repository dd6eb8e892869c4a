#include "balancer/topology.h"

#include <gtest/gtest.h>

namespace gcmoe::balancer {
namespace {

TEST(TopologyTest, TorusNeighboursFollowTheDesignFormula) {
  const Topology t = MakeTorus(4, 8).value();
  ASSERT_EQ(t.degree(), 2);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(t.Neighbour(i * 8 + j, 0), ((i + 1) % 4) * 8 + j);
      EXPECT_EQ(t.Neighbour(i * 8 + j, 1), i * 8 + (j + 1) % 8);
    }
  }
  EXPECT_EQ(t.Neighbour(31, 0), 7);   // (3,7) -> (0,7)
  EXPECT_EQ(t.Neighbour(31, 1), 24);  // (3,7) -> (3,0)
}

TEST(TopologyTest, CubeNeighboursFlipOneBit) {
  const Topology t = MakeCube(8).value();
  ASSERT_EQ(t.degree(), 3);
  EXPECT_EQ(t.Neighbour(5, 0), 4);
  EXPECT_EQ(t.Neighbour(5, 1), 7);
  EXPECT_EQ(t.Neighbour(5, 2), 1);
  EXPECT_FALSE(MakeCube(6).ok());
  EXPECT_FALSE(MakeCube(1).ok());
}

TEST(TopologyTest, RingNeighboursAreBothSides) {
  const Topology t = MakeRing(5).value();
  EXPECT_EQ(t.Neighbour(0, 0), 1);
  EXPECT_EQ(t.Neighbour(0, 1), 4);
  EXPECT_EQ(t.Neighbour(4, 0), 0);
}

TEST(TopologyTest, DefaultIsTheNearSquareTorusOrARing) {
  const std::pair<int, std::string> expected[] = {
      {4, "torus 2x2"},  {8, "torus 2x4"},  {16, "torus 4x4"}, {32, "torus 4x8"},
      {64, "torus 8x8"}, {12, "torus 3x4"}, {7, "ring 7"},     {2, "ring 2"}};
  for (const auto& [g, name] : expected) EXPECT_EQ(DefaultTopology(g)->ToString(), name) << g;
}

TEST(TopologyTest, NoRankIsItsOwnNeighbour) {
  for (const char* spec : {"torus", "cube", "ring"}) {
    for (int g : {2, 4, 8, 16, 32, 64}) {
      Result<Topology> t = ParseTopology(spec, g);
      if (!t.ok()) continue;  // e.g. torus needs two sides >= 2; checked below
      for (int r = 0; r < g; ++r) {
        for (int d = 0; d < t->degree(); ++d) {
          EXPECT_NE(t->Neighbour(r, d), r) << spec << " G=" << g;
          EXPECT_GE(t->Neighbour(r, d), 0);
          EXPECT_LT(t->Neighbour(r, d), g);
        }
      }
    }
  }
}

TEST(TopologyTest, ParseChecksShapes) {
  EXPECT_EQ(ParseTopology("torus:4x8", 32)->ToString(), "torus 4x8");
  EXPECT_FALSE(ParseTopology("torus:4x4", 32).ok());
  EXPECT_FALSE(ParseTopology("torus:1x8", 8).ok());
  EXPECT_FALSE(ParseTopology("torus:4y8", 32).ok());
  EXPECT_FALSE(ParseTopology("mesh", 8).ok());
  EXPECT_EQ(ParseTopology("mesh", 8).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gcmoe::balancer
