// The exact LP against hand-solved instances.
#include "balancer/lp_oracle.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

namespace gcmoe::balancer {
namespace {

Placement Make(int ranks, std::vector<int> home, std::vector<int> host) {
  Placement p;
  p.num_ranks = ranks;
  p.num_experts = static_cast<int>(home.size());
  p.home = std::move(home);
  p.host = std::move(host);
  return p;
}

// L0 = 10 + 20x, L1 = 4 + 20(1 - x): equal at x = 0.35, z = 17.
TEST(LpOracleTest, TwoRanksMeetInTheMiddle) {
  const LpSplit lp = SolveMinMaxLp(Make(2, {0, 0, 1}, {1, -1, -1}), std::vector<int64_t>{20, 10, 4}).value();
  EXPECT_NEAR(lp.max_load, 17.0, 1e-9);
  EXPECT_NEAR(lp.home_fraction[0], 0.35, 1e-9);
  EXPECT_EQ(lp.home_fraction[1], 1.0);
  EXPECT_NEAR(lp.loads[0], 17.0, 1e-9);
  EXPECT_NEAR(lp.loads[1], 17.0, 1e-9);
}

// Rank 0 carries 20 it cannot shed; sending all 6 replicated tokens away is optimal: z = 20.
TEST(LpOracleTest, BoxConstraintBinds) {
  const LpSplit lp = SolveMinMaxLp(Make(2, {0, 0}, {1, -1}), std::vector<int64_t>{6, 20}).value();
  EXPECT_NEAR(lp.max_load, 20.0, 1e-9);
  EXPECT_NEAR(lp.home_fraction[0], 0.0, 1e-9);
}

// A chain 0 -> 1 -> 2 of two 12-token experts: 24 tokens level at 8 each with x_a = 2/3,
// x_b = 1/3.
TEST(LpOracleTest, ChainLevelsThroughTheMiddleRank) {
  const LpSplit lp = SolveMinMaxLp(Make(3, {0, 1}, {1, 2}), std::vector<int64_t>{12, 12}).value();
  EXPECT_NEAR(lp.max_load, 8.0, 1e-9);
  EXPECT_NEAR(lp.home_fraction[0], 2.0 / 3.0, 1e-9);
  EXPECT_NEAR(lp.home_fraction[1], 1.0 / 3.0, 1e-9);
}

TEST(LpOracleTest, EmptyStepAndErrors) {
  const Placement p = Make(2, {0, 1}, {1, -1});
  EXPECT_NEAR(SolveMinMaxLp(p, std::vector<int64_t>{0, 0})->max_load, 0.0, 1e-12);
  EXPECT_EQ(SolveMinMaxLp(p, std::vector<int64_t>{1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SolveMinMaxLp(p, std::vector<int64_t>{1, -1}).status().code(),
            StatusCode::kInvalidArgument);
}

// GLPK must not write to stdout (the CLI prints JSON there).
TEST(LpOracleTest, PrintsNothing) {
  std::fflush(stdout);
  FILE* capture = std::tmpfile();
  ASSERT_NE(capture, nullptr);
  const int saved = dup(STDOUT_FILENO);
  ASSERT_GE(saved, 0);
  ASSERT_GE(dup2(fileno(capture), STDOUT_FILENO), 0);
  const Result<LpSplit> lp =
      SolveMinMaxLp(Make(3, {0, 1, 2}, {1, 2, 0}), std::vector<int64_t>{30, 5, 9});
  std::fflush(stdout);
  dup2(saved, STDOUT_FILENO);
  close(saved);
  ASSERT_TRUE(lp.ok());
  EXPECT_EQ(std::ftell(capture), 0L);
  std::fclose(capture);
}

}  // namespace
}  // namespace gcmoe::balancer
