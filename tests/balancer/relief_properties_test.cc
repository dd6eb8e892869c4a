// Relief on random instances, against independent references: the integer bookkeeping
// recomputed from the emitted split, the all-home loads, the exact LP (GLPK), and the scalar
// reference kernel (every SIMD kernel must match it bit for bit).
#include <gtest/gtest.h>

#include <numeric>

#include "balancer/lp_oracle.h"
#include "balancer/relief.h"
#include "test_instances.h"

namespace gcmoe::balancer {
namespace {

using testing::Rng;

std::vector<ReliefKernel> SimdKernels() {
  std::vector<ReliefKernel> kernels;
  if (ReliefKernelAvailable(ReliefKernel::kAvx2)) kernels.push_back(ReliefKernel::kAvx2);
  if (ReliefKernelAvailable(ReliefKernel::kAvx512)) kernels.push_back(ReliefKernel::kAvx512);
  return kernels;
}

struct Instance {
  Placement placement;
  std::vector<int64_t> tokens;
  int fraction_bits;
  int passes;
};

// Mixes topology placements (every round a matching the SIMD kernels pair up), arbitrary
// placements (general rounds, several transfers per rank pair, idle lanes), rank counts that
// are not multiples of the SIMD width, empty steps and steps near the 2^31 limit.
Instance RandomInstance(Rng& rng, int trial) {
  Instance in;
  const int g = rng.Uniform(1, 80);
  if (trial % 3 == 0 || g < 2) {
    in.placement = testing::RandomPlacement(rng, g, rng.Uniform(1, 300));
  } else {
    Result<Topology> topology = trial % 3 == 1 ? DefaultTopology(g) : MakeRing(g);
    std::vector<double> mean;
    in.placement = testing::TopologyPlacement(rng, topology.value(), rng.Uniform(1, 5 * g),
                                              rng.Uniform(0, 2), &mean);
  }
  const int e = in.placement.num_experts;
  switch (trial % 7) {
    case 0: in.tokens.assign(e, 0); break;
    case 1: in.tokens = testing::UniformStep(rng, e, (int64_t{1} << 31) / (e + 1) - 1); break;
    case 2: in.tokens = testing::UniformStep(rng, e, 3); break;
    default: in.tokens = testing::UniformStep(rng, e, rng.Uniform(1, 5000)); break;
  }
  in.fraction_bits = rng.Uniform(0, 30);
  in.passes = rng.Uniform(0, 40);
  return in;
}

TEST(ReliefPropertiesTest, SplitInvariantsHold) {
  Rng rng(1234);
  int fallbacks = 0;
  constexpr int kTrials = 1500;
  for (int trial = 0; trial < kTrials; ++trial) {
    const Instance in = RandomInstance(rng, trial);
    auto relief = CreateReliefBalancer({.fraction_bits = in.fraction_bits, .passes = in.passes,
                                        .kernel = ReliefKernel::kScalar})
                      .value();
    ASSERT_TRUE(relief->SetPlacement(in.placement).ok());
    Split split;
    ASSERT_TRUE(relief->Solve(in.tokens, &split).ok());
    const Placement& p = in.placement;
    const int g = p.num_ranks;
    const int f = relief->fraction_bits_used();
    std::vector<int64_t> mass(p.num_experts);
    relief->HomeMass(mass);

    // Recompute both load vectors from the emitted split alone.
    std::vector<int64_t> before(g, 0), after(g, 0);
    for (int e = 0; e < p.num_experts; ++e) {
      const int64_t n = in.tokens[e];
      ASSERT_GE(split.home_tokens[e], 0);
      ASSERT_LE(split.home_tokens[e], n);
      before[p.home[e]] += n;
      after[p.home[e]] += split.home_tokens[e];
      if (p.replicated(e)) {
        after[p.host[e]] += n - split.home_tokens[e];
        ASSERT_GE(mass[e], 0);
        ASSERT_LE(mass[e], n << f);
      } else {
        ASSERT_EQ(split.home_tokens[e], n);
      }
    }
    ASSERT_EQ(split.load_before, before);
    ASSERT_EQ(split.load_after, after);
    const int64_t total = std::accumulate(in.tokens.begin(), in.tokens.end(), int64_t{0});
    ASSERT_EQ(std::accumulate(after.begin(), after.end(), int64_t{0}), total);
    ASSERT_LE(testing::MaxOf(after), testing::MaxOf(before)) << "trial " << trial;
    std::vector<double> fractional(g);
    relief->FractionalLoads(fractional);
    ASSERT_NEAR(std::accumulate(fractional.begin(), fractional.end(), 0.0), static_cast<double>(total),
                1e-6 * static_cast<double>(total) + 1e-9);
    ASSERT_LE(*std::max_element(fractional.begin(), fractional.end()),
              static_cast<double>(testing::MaxOf(before)));
    fallbacks += relief->fell_back() ? 1 : 0;
  }
  // The rounding guard is a safety net, not the normal path.
  EXPECT_LT(fallbacks, kTrials / 100) << fallbacks << " fallbacks";
}

TEST(ReliefPropertiesTest, SimdKernelsMatchTheScalarReferenceBitForBit) {
  const std::vector<ReliefKernel> kernels = SimdKernels();
  if (kernels.empty()) GTEST_SKIP() << "no SIMD kernel on this CPU; nothing to compare";
  Rng rng(4321);
  for (int trial = 0; trial < 3000; ++trial) {
    const Instance in = RandomInstance(rng, trial);
    auto reference = CreateReliefBalancer({.fraction_bits = in.fraction_bits, .passes = in.passes,
                                           .kernel = ReliefKernel::kScalar})
                         .value();
    ASSERT_TRUE(reference->SetPlacement(in.placement).ok());
    Split expected;
    ASSERT_TRUE(reference->Solve(in.tokens, &expected).ok());
    std::vector<int64_t> expected_mass(in.placement.num_experts);
    reference->HomeMass(expected_mass);
    std::vector<double> expected_loads(in.placement.num_ranks);
    reference->FractionalLoads(expected_loads);
    for (ReliefKernel kernel : kernels) {
      auto simd = CreateReliefBalancer({.fraction_bits = in.fraction_bits, .passes = in.passes,
                                        .kernel = kernel})
                      .value();
      ASSERT_TRUE(simd->SetPlacement(in.placement).ok());
      Split got;
      // Twice: the second solve reuses every buffer the first one filled.
      ASSERT_TRUE(simd->Solve(in.tokens, &got).ok());
      ASSERT_TRUE(simd->Solve(in.tokens, &got).ok());
      std::vector<int64_t> mass(in.placement.num_experts);
      simd->HomeMass(mass);
      std::vector<double> loads(in.placement.num_ranks);
      simd->FractionalLoads(loads);
      ASSERT_EQ(got.home_tokens, expected.home_tokens) << simd->kernel_name() << " trial " << trial;
      ASSERT_EQ(got.load_after, expected.load_after) << simd->kernel_name() << " trial " << trial;
      ASSERT_EQ(got.load_before, expected.load_before);
      ASSERT_EQ(mass, expected_mass) << simd->kernel_name() << " trial " << trial;
      ASSERT_EQ(loads, expected_loads);
      ASSERT_EQ(simd->fell_back(), reference->fell_back());
    }
  }
}

// The LP optimum bounds every split from below, and Relief at I = 12 comes close to it on
// topology placements with skewed loads.
TEST(ReliefPropertiesTest, NeverBelowTheLpAndCloseToIt) {
  Rng rng(77);
  double attainment_sum = 0.0;
  int count = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const int g = std::vector<int>{4, 8, 16, 32, 64}[trial % 5];
    std::vector<double> mean;
    const Placement p = testing::TopologyPlacement(rng, DefaultTopology(g).value(), 4 * g, 2, &mean);
    const std::vector<int64_t> step = testing::RandomStep(rng, mean, 32 * g);
    auto relief = CreateReliefBalancer({.passes = 12}).value();
    ASSERT_TRUE(relief->SetPlacement(p).ok());
    Split split;
    ASSERT_TRUE(relief->Solve(step, &split).ok());
    std::vector<double> loads(g);
    relief->FractionalLoads(loads);
    const double relief_peak = *std::max_element(loads.begin(), loads.end());
    const LpSplit lp = SolveMinMaxLp(p, step).value();
    ASSERT_GE(relief_peak, lp.max_load - 1e-6 * lp.max_load) << "trial " << trial;
    attainment_sum += lp.max_load / relief_peak;
    ++count;
  }
  EXPECT_GT(attainment_sum / count, 0.99);
}

}  // namespace
}  // namespace gcmoe::balancer
