#include "balancer/transfer_list.h"

#include <gtest/gtest.h>

#include <set>

#include "test_instances.h"

namespace gcmoe::balancer {
namespace {

using testing::Rng;

// Every replicated expert exactly once, each round rank-disjoint.
void ExpectProperColouring(const Placement& p, const TransferList& list) {
  std::multiset<int> experts;
  for (const Transfer& t : list.transfers) {
    experts.insert(t.expert);
    EXPECT_EQ(t.home, p.home[t.expert]);
    EXPECT_EQ(t.host, p.host[t.expert]);
  }
  for (int e = 0; e < p.num_experts; ++e) EXPECT_EQ(experts.count(e), p.replicated(e) ? 1u : 0u);
  ASSERT_EQ(list.round_begin.front(), 0);
  ASSERT_EQ(list.round_begin.back(), static_cast<int>(list.transfers.size()));
  for (int r = 0; r < list.num_rounds(); ++r) {
    EXPECT_LT(list.round_begin[r], list.round_begin[r + 1]) << "empty round " << r;
    std::set<int> ranks;
    for (int t = list.round_begin[r]; t < list.round_begin[r + 1]; ++t) {
      EXPECT_TRUE(ranks.insert(list.transfers[t].home).second) << "round " << r;
      EXPECT_TRUE(ranks.insert(list.transfers[t].host).second) << "round " << r;
    }
  }
}

TEST(TransferListTest, TopologiesColourIn2DRounds) {
  Rng rng(11);
  struct Case {
    Topology topology;
    int d;
  };
  const Case cases[] = {
      {MakeTorus(8, 8).value(), 2}, {MakeTorus(4, 8).value(), 2}, {MakeTorus(4, 4).value(), 2},
      {MakeTorus(2, 4).value(), 2}, {MakeTorus(2, 2).value(), 2}, {MakeTorus(8, 8).value(), 1},
      {MakeCube(8).value(), 2},     {MakeCube(8).value(), 3},     {MakeRing(8).value(), 2},
      {MakeRing(16).value(), 2},    {MakeRing(16).value(), 1},
  };
  for (const Case& c : cases) {
    for (int repeat = 0; repeat < 5; ++repeat) {
      // Enough experts that every rank replicates D of its own.
      const Placement p = testing::TopologyPlacement(rng, c.topology, 4 * c.topology.num_ranks, c.d);
      const TransferList list = CompileTransferList(p).value();
      ExpectProperColouring(p, list);
      EXPECT_EQ(list.max_degree, 2 * c.d) << c.topology.ToString();
      EXPECT_EQ(list.num_rounds(), 2 * c.d) << c.topology.ToString() << " D=" << c.d;
      // 2D colours on a 2D-regular graph: every round is a perfect matching.
      for (int r = 0; r < list.num_rounds(); ++r) {
        EXPECT_EQ(list.round_begin[r + 1] - list.round_begin[r], c.topology.num_ranks / 2);
      }
    }
  }
}

TEST(TransferListTest, RandomPlacementsAreProperlyColoured) {
  Rng rng(12);
  for (int trial = 0; trial < 300; ++trial) {
    const int g = rng.Uniform(1, 40);
    const Placement p = testing::RandomPlacement(rng, g, rng.Uniform(1, 120));
    const TransferList list = CompileTransferList(p).value();
    ExpectProperColouring(p, list);
    EXPECT_GE(list.num_rounds(), list.max_degree);
    EXPECT_LE(list.num_rounds(), std::max(0, 2 * list.max_degree - 1));  // first-fit's bound
  }
}

TEST(TransferListTest, NoReplicasNoRounds) {
  const TransferList list = CompileTransferList(ContiguousPlacement(4, 16)).value();
  EXPECT_EQ(list.num_rounds(), 0);
  EXPECT_TRUE(list.transfers.empty());
}

TEST(TransferListTest, RejectsInvalidPlacement) {
  Placement p = ContiguousPlacement(2, 2);
  p.host[0] = p.home[0];
  EXPECT_EQ(CompileTransferList(p).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gcmoe::balancer
