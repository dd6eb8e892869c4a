// EPLB-compatible placement: hand-derived cases (following EPLB's published algorithm step by
// step in the comments) and structural properties on random inputs.
#include "balancer/eplb.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "test_instances.h"

namespace gcmoe::balancer {
namespace {

using testing::Rng;

// Global policy (groups 1, nodes 1), 4 experts {10, 1, 1, 1}, 6 slots on 2 GPUs.
// Replicate: slot 4 -> argmax w/cnt = e0 (10); slot 5 -> e0 again (10/2 = 5 > 1). Pre-packing
// phy2log = [0 1 2 3 0 0], replica ranks [0 0 0 0 1 2]; per-slot weights
// [3.33 1 1 1 3.33 3.33]. Packing 3 per GPU, heaviest first (ties in index order):
//   item0 -> g0; item4 -> g1; item5 -> g0 (tie, first); item1 -> g1; item2 -> g1 (full);
//   item3 -> g0. Slots: g0 = items 0, 5, 3; g1 = items 4, 1, 2.
TEST(EplbTest, GlobalPolicyHandExample) {
  const EplbPlacement p = RebalanceExperts(std::vector<double>{10, 1, 1, 1}, 1, 6, 1, 1, 2).value();
  EXPECT_EQ(p.phy2log, (std::vector<int>{0, 0, 3, 0, 1, 2}));
  EXPECT_EQ(p.logcnt, (std::vector<int>{3, 1, 1, 1}));
  ASSERT_EQ(p.max_replicas, 3);
  EXPECT_EQ(p.log2phy, (std::vector<int>{0, 3, 1, 4, -1, -1, 5, -1, -1, 2, -1, -1}));
  // 10 tokens over 3 replicas: 4, 3, 3 to replica ranks 0, 1, 2 (slots 0, 3, 1).
  std::vector<int64_t> loads(2);
  ASSERT_TRUE(EplbStepLoads(p, 0, std::vector<int64_t>{10, 1, 1, 1}, loads).ok());
  EXPECT_EQ(loads, (std::vector<int64_t>{4 + 3 + 1, 3 + 1 + 1}));
}

// Hierarchical: 8 experts in 4 groups of 2 {1 1 | 5 5 | 2 2 | 3 3}, 2 nodes, 4 GPUs, 8 slots.
// Groups onto nodes (2 each), heaviest first: g1 (10) -> n0; g3 (6) -> n1; g2 (4) -> n1;
// g0 -> n0. Node 0 holds experts 2 3 0 1, node 1 holds 6 7 4 5 (mlog order). No extra slots.
// Node 0's slots onto its 2 GPUs: weights 5 5 1 1 -> e2 g0, e3 g1, e0 g0 (tie), e1 g1; so the
// slots read 2 0 | 3 1; node 1 likewise 6 4 | 7 5.
TEST(EplbTest, HierarchicalPolicyHandExample) {
  const EplbPlacement p =
      RebalanceExperts(std::vector<double>{1, 1, 5, 5, 2, 2, 3, 3}, 1, 8, 4, 2, 4).value();
  EXPECT_EQ(p.phy2log, (std::vector<int>{2, 0, 3, 1, 6, 4, 7, 5}));
  EXPECT_EQ(p.logcnt, std::vector<int>(8, 1));
}

// groups % nodes != 0 selects the global policy: the same as groups = nodes = 1.
TEST(EplbTest, FallsBackToGlobalPolicy) {
  Rng rng(3);
  std::vector<double> w(2 * 12);
  for (double& x : w) x = rng.Skewed();
  const EplbPlacement a = RebalanceExperts(w, 2, 16, 3, 2, 4).value();
  const EplbPlacement b = RebalanceExperts(w, 2, 16, 1, 1, 4).value();
  EXPECT_EQ(a.phy2log, b.phy2log);
  EXPECT_EQ(a.log2phy, b.log2phy);
  EXPECT_EQ(a.logcnt, b.logcnt);
}

TEST(EplbTest, PropertiesOnRandomInputs) {
  Rng rng(9);
  for (int trial = 0; trial < 200; ++trial) {
    const int nodes = rng.Uniform(1, 3);
    const int gpus = nodes * rng.Uniform(1, 4);
    const int groups = nodes * rng.Uniform(1, 3);
    const int experts = groups * rng.Uniform(1, 6);
    const int replicas = gpus * ((experts + gpus - 1) / gpus + rng.Uniform(0, 3));
    const int layers = rng.Uniform(1, 3);
    std::vector<double> w(layers * experts);
    for (double& x : w) x = trial % 4 == 0 ? static_cast<double>(rng.Uniform(0, 3)) : rng.Skewed();
    Result<EplbPlacement> result = RebalanceExperts(w, layers, replicas, groups, nodes, gpus);
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    const EplbPlacement& p = *result;
    const int per_gpu = replicas / gpus;
    const int gpus_per_node = gpus / nodes;
    const int group_size = experts / groups;
    for (int l = 0; l < layers; ++l) {
      int sum = 0;
      std::set<int> slots;
      for (int e = 0; e < experts; ++e) {
        const int c = p.logcnt_at(l, e);
        ASSERT_GE(c, 1);
        sum += c;
        std::set<int> nodes_of_expert;
        for (int r = 0; r < p.max_replicas; ++r) {
          const int slot = p.log2phy_at(l, e, r);
          if (r >= c) {
            EXPECT_EQ(slot, -1);
            continue;
          }
          ASSERT_GE(slot, 0);
          EXPECT_EQ(p.phy2log_at(l, slot), e);
          EXPECT_TRUE(slots.insert(slot).second);
          nodes_of_expert.insert(slot / per_gpu / gpus_per_node);
        }
        // Hierarchical: an expert's replicas stay on one node, and so does its whole group.
        EXPECT_EQ(nodes_of_expert.size(), 1u);
        const int leader = (e / group_size) * group_size;
        EXPECT_EQ(p.log2phy_at(l, e, 0) / per_gpu / gpus_per_node,
                  p.log2phy_at(l, leader, 0) / per_gpu / gpus_per_node);
      }
      EXPECT_EQ(sum, replicas);
      EXPECT_EQ(static_cast<int>(slots.size()), replicas);
      // Replica ranks of each expert are a permutation of 0..c-1 (log2phy has no gaps).
    }
    // Even split conserves tokens.
    std::vector<int64_t> tokens = testing::UniformStep(rng, experts, 1000);
    std::vector<int64_t> loads(gpus);
    ASSERT_TRUE(EplbStepLoads(p, layers - 1, tokens, loads).ok());
    EXPECT_EQ(std::accumulate(loads.begin(), loads.end(), int64_t{0}),
              std::accumulate(tokens.begin(), tokens.end(), int64_t{0}));
  }
}

TEST(EplbTest, RejectsWhatEplbAsserts) {
  const std::vector<double> w(8, 1.0);
  EXPECT_FALSE(RebalanceExperts(w, 1, 6, 1, 1, 2).ok());   // replicas < experts
  EXPECT_FALSE(RebalanceExperts(w, 1, 9, 1, 1, 2).ok());   // replicas % gpus
  EXPECT_FALSE(RebalanceExperts(w, 1, 8, 2, 2, 3).ok());   // gpus % nodes
  EXPECT_FALSE(RebalanceExperts(w, 1, 12, 3, 3, 3).ok());  // experts % groups (hierarchical)
  EXPECT_FALSE(RebalanceExperts(w, 3, 8, 1, 1, 2).ok());   // 8 weights are not 3 layers
  EXPECT_FALSE(RebalanceExperts(std::vector<double>{1, -1}, 1, 2, 1, 1, 1).ok());
  EXPECT_EQ(RebalanceExperts(w, 1, 6, 1, 1, 2).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gcmoe::balancer
