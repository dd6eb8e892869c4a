// Relief on hand-checkable instances, its contract (errors, allocation, determinism across
// objects and processes) and the pass-count choice of Eq. 3.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "allocation_counter.h"
#include "balancer/relief.h"
#include "test_instances.h"

namespace gcmoe::balancer {
namespace {

using testing::Rng;

std::vector<ReliefKernel> AvailableKernels() {
  std::vector<ReliefKernel> kernels = {ReliefKernel::kScalar};
  if (ReliefKernelAvailable(ReliefKernel::kAvx2)) kernels.push_back(ReliefKernel::kAvx2);
  if (ReliefKernelAvailable(ReliefKernel::kAvx512)) kernels.push_back(ReliefKernel::kAvx512);
  return kernels;
}

std::unique_ptr<ReliefBalancer> Make(ReliefOptions options) {
  Result<std::unique_ptr<ReliefBalancer>> b = CreateReliefBalancer(options);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return std::move(b).value();
}

// The paper's worked example (relief.txt Fig. 5, DESIGN.md §5): loads 66 and 27 with enough
// mass at home: delta = min(39 >> 1, mass) = 19, loads become 47 and 46.
// Rank 0: expert 0 (30 tokens, replicated to rank 1) + expert 1 (36); rank 1: expert 2 (27).
TEST(ReliefSolverTest, PaperWorkedExample) {
  Placement p;
  p.num_ranks = 2;
  p.num_experts = 3;
  p.home = {0, 0, 1};
  p.host = {1, -1, -1};
  const std::vector<int64_t> tokens = {30, 36, 27};
  for (ReliefKernel kernel : AvailableKernels()) {
    for (int passes : {1, 12}) {
      auto relief = Make({.fraction_bits = 0, .passes = passes, .kernel = kernel});
      ASSERT_TRUE(relief->SetPlacement(p).ok());
      Split split;
      ASSERT_TRUE(relief->Solve(tokens, &split).ok());
      EXPECT_EQ(split.load_before, (std::vector<int64_t>{66, 27}));
      // The truncated halve leaves the two ranks one apart; one LSB of gap then moves nothing
      // (delta 0 is not above epsilon), so more passes change nothing.
      EXPECT_EQ(split.load_after, (std::vector<int64_t>{47, 46})) << relief->kernel_name();
      EXPECT_EQ(split.home_tokens, (std::vector<int64_t>{11, 36, 27}));
      EXPECT_EQ(split.passes, passes);
      std::vector<int64_t> mass(3);
      relief->HomeMass(mass);
      EXPECT_EQ(mass[0], 11);
      EXPECT_EQ(mass[1], -1);
    }
  }
}

// With F fractional bits the same move halves exactly: 39 << F >> 1 is 19.5 tokens, so the
// fixed-point loads meet at 46.5, and emission rounds the home share 10.5 up to 11.
TEST(ReliefSolverTest, FractionalBitsSplitTheOddToken) {
  Placement p;
  p.num_ranks = 2;
  p.num_experts = 3;
  p.home = {0, 0, 1};
  p.host = {1, -1, -1};
  for (ReliefKernel kernel : AvailableKernels()) {
    auto relief = Make({.fraction_bits = 8, .passes = 1, .kernel = kernel});
    ASSERT_TRUE(relief->SetPlacement(p).ok());
    Split split;
    ASSERT_TRUE(relief->Solve(std::vector<int64_t>{30, 36, 27}, &split).ok());
    std::vector<double> fractional(2);
    relief->FractionalLoads(fractional);
    EXPECT_DOUBLE_EQ(fractional[0], 46.5);
    EXPECT_DOUBLE_EQ(fractional[1], 46.5);
    EXPECT_EQ(split.home_tokens[0], 11);
    EXPECT_EQ(split.load_after, (std::vector<int64_t>{47, 46}));
  }
}

// Epsilon is one LSB: with F = 0 a gap of 3 halves to 1 and moves nothing, a gap of 4 moves 2.
TEST(ReliefSolverTest, EpsilonIsOneLsb) {
  Placement p;
  p.num_ranks = 2;
  p.num_experts = 2;
  p.home = {0, 1};
  p.host = {1, -1};
  for (ReliefKernel kernel : AvailableKernels()) {
    auto relief = Make({.fraction_bits = 0, .passes = 3, .kernel = kernel});
    ASSERT_TRUE(relief->SetPlacement(p).ok());
    Split split;
    ASSERT_TRUE(relief->Solve(std::vector<int64_t>{10, 7}, &split).ok());  // gap 3
    EXPECT_EQ(split.load_after, (std::vector<int64_t>{10, 7}));
    ASSERT_TRUE(relief->Solve(std::vector<int64_t>{10, 6}, &split).ok());  // gap 4
    EXPECT_EQ(split.load_after, (std::vector<int64_t>{8, 8}));
  }
}

// The move is capped by what the sending side holds: here only 5 tokens can leave rank 0.
TEST(ReliefSolverTest, MoveIsCappedByMass) {
  Placement p;
  p.num_ranks = 2;
  p.num_experts = 2;
  p.home = {0, 0};
  p.host = {1, -1};
  for (ReliefKernel kernel : AvailableKernels()) {
    auto relief = Make({.fraction_bits = 4, .passes = 12, .kernel = kernel});
    ASSERT_TRUE(relief->SetPlacement(p).ok());
    Split split;
    ASSERT_TRUE(relief->Solve(std::vector<int64_t>{5, 100}, &split).ok());
    EXPECT_EQ(split.home_tokens[0], 0);
    EXPECT_EQ(split.load_after, (std::vector<int64_t>{100, 5}));
  }
}

TEST(ReliefSolverTest, RejectsBadStepsWithNamedFields) {
  auto relief = Make({});
  Split unplaced;
  EXPECT_EQ(relief->Solve(std::vector<int64_t>{}, &unplaced).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(relief->SetPlacement(ContiguousPlacement(2, 4)).ok());
  Split split;
  Status s = relief->Solve(std::vector<int64_t>{1, 2, 3}, &split);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected 4"), std::string::npos) << s.message();
  s = relief->Solve(std::vector<int64_t>{1, -2, 3, 4}, &split);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expert_tokens[1]"), std::string::npos) << s.message();
  s = relief->Solve(std::vector<int64_t>{1LL << 30, 1LL << 30, 1LL << 30, 1}, &split);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
}

TEST(ReliefSolverTest, RejectsBadOptions) {
  EXPECT_FALSE(CreateReliefBalancer({.fraction_bits = 31}).ok());
  EXPECT_FALSE(CreateReliefBalancer({.fraction_bits = -1}).ok());
  EXPECT_FALSE(CreateReliefBalancer({.passes = -1}).ok());
  EXPECT_FALSE(CreateReliefBalancer({.auto_passes = true, .max_passes = 0}).ok());
  EXPECT_FALSE(CreateReliefBalancer({.auto_passes = true, .t_moe_us = 0}).ok());
  if (!ReliefKernelAvailable(ReliefKernel::kAvx512)) {
    EXPECT_EQ(CreateReliefBalancer({.kernel = ReliefKernel::kAvx512}).status().code(),
              StatusCode::kUnimplemented);
  }
}

// A step whose total << F would overflow 31 bits runs with fewer fractional bits.
TEST(ReliefSolverTest, LowersFractionBitsForLargeSteps) {
  auto relief = Make({.fraction_bits = 20});
  Rng rng(3);
  ASSERT_TRUE(relief->SetPlacement(testing::TopologyPlacement(rng, DefaultTopology(8).value(), 32, 2)).ok());
  Split split;
  std::vector<int64_t> tokens(32, 1 << 15);  // total 2^20: 21 bits
  ASSERT_TRUE(relief->Solve(tokens, &split).ok());
  EXPECT_EQ(relief->fraction_bits_used(), 10);
  std::vector<int64_t> small(32, 10);  // total 320: 9 bits
  ASSERT_TRUE(relief->Solve(small, &split).ok());
  EXPECT_EQ(relief->fraction_bits_used(), 20);
}

TEST(ReliefSolverTest, SolveDoesNotAllocate) {
  Rng rng(5);
  std::vector<double> mean;
  const Placement p = testing::TopologyPlacement(rng, DefaultTopology(64).value(), 256, 2, &mean);
  std::vector<std::vector<int64_t>> steps;
  for (int i = 0; i < 16; ++i) steps.push_back(testing::RandomStep(rng, mean, 4096));
  for (ReliefKernel kernel : AvailableKernels()) {
    for (bool auto_passes : {false, true}) {
      auto relief = Make({.passes = 12, .auto_passes = auto_passes, .calibration_steps = 4,
                          .kernel = kernel});
      ASSERT_TRUE(relief->SetPlacement(p).ok());
      Split split;
      ASSERT_TRUE(relief->Solve(steps[0], &split).ok());  // sizes the Split
      const long before = testing::AllocationCount();
      for (const auto& step : steps) ASSERT_TRUE(relief->Solve(step, &split).ok());
      EXPECT_EQ(testing::AllocationCount() - before, 0) << relief->kernel_name();
    }
  }
}

uint64_t HashSplits(ReliefKernel kernel, uint64_t seed) {
  Rng rng(seed);
  uint64_t hash = 0xCBF29CE484222325ull;
  for (int trial = 0; trial < 40; ++trial) {
    const int g = rng.Uniform(2, 64);
    const Placement p = trial % 2 ? testing::RandomPlacement(rng, g, rng.Uniform(1, 200))
                                  : testing::TopologyPlacement(rng, DefaultTopology(g).value(),
                                                               rng.Uniform(g, 4 * g), 2);
    auto relief = Make({.fraction_bits = rng.Uniform(0, 24), .passes = rng.Uniform(0, 20),
                        .kernel = kernel});
    EXPECT_TRUE(relief->SetPlacement(p).ok());
    Split split;
    EXPECT_TRUE(relief->Solve(testing::UniformStep(rng, p.num_experts, 500), &split).ok());
    for (int64_t v : split.home_tokens) hash = (hash ^ static_cast<uint64_t>(v)) * 0x100000001B3ull;
    for (int64_t v : split.load_after) hash = (hash ^ static_cast<uint64_t>(v)) * 0x100000001B3ull;
  }
  return hash;
}

// The same inputs give the same split from a fresh object, from every kernel, and from another
// process.
TEST(ReliefSolverTest, DeterministicAcrossObjectsKernelsAndProcesses) {
  const uint64_t reference = HashSplits(ReliefKernel::kScalar, 99);
  EXPECT_EQ(HashSplits(ReliefKernel::kScalar, 99), reference);
  for (ReliefKernel kernel : AvailableKernels()) EXPECT_EQ(HashSplits(kernel, 99), reference);
  EXPECT_NE(HashSplits(ReliefKernel::kScalar, 100), reference);  // the hash sees the inputs

  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    const uint64_t h = HashSplits(ReliefKernel::kAuto, 99);
    const bool wrote = write(fds[1], &h, sizeof(h)) == static_cast<ssize_t>(sizeof(h));
    _exit(wrote ? 0 : 1);
  }
  close(fds[1]);
  uint64_t from_child = 0;
  ASSERT_EQ(read(fds[0], &from_child, sizeof(from_child)), static_cast<ssize_t>(sizeof(from_child)));
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(from_child, reference);
}

// Every move lowers the heavier of two ranks and never below the lighter, so the peak never
// rises and mean / max never falls from pass to pass; p = 0 is the all-home balance.
TEST(ReliefSolverTest, BalanceCurveIsMonotone) {
  Rng rng(21);
  for (ReliefKernel kernel : AvailableKernels()) {
    for (int trial = 0; trial < 20; ++trial) {
      const int g = std::vector<int>{8, 16, 32, 64}[trial % 4];
      std::vector<double> mean;
      const Placement p = testing::TopologyPlacement(rng, DefaultTopology(g).value(), 2 * g, 2, &mean);
      auto relief = Make({.kernel = kernel});
      ASSERT_TRUE(relief->SetPlacement(p).ok());
      const std::vector<int64_t> step = testing::RandomStep(rng, mean, 64 * g);
      std::vector<double> curve(20);
      ASSERT_TRUE(relief->RecordBalanceCurve(step, curve).ok());
      Split split;
      auto zero = Make({.passes = 0, .kernel = kernel});
      ASSERT_TRUE(zero->SetPlacement(p).ok());
      ASSERT_TRUE(zero->Solve(step, &split).ok());
      double sum = 0;
      for (int64_t l : split.load_before) sum += static_cast<double>(l);
      EXPECT_NEAR(curve[0], sum / g / static_cast<double>(testing::MaxOf(split.load_before)), 1e-12);
      for (size_t i = 1; i < curve.size(); ++i) EXPECT_GE(curve[i], curve[i - 1]);
    }
  }
}

TEST(ReliefSolverTest, ChoosePassCountHandExample) {
  // U(p) = s / (1 + t / T): at T = 1 us: .4545 .6667 .6923 .6500 -> 2;
  // at T = 100 us: .4998 .7984 .8973 .9064 -> 3; at T = 0.01 us every pass costs more than
  // it gains: 0 (.0455 against .0381 ...).
  const std::vector<double> s = {0.5, 0.8, 0.9, 0.91};
  const std::vector<double> t = {100, 200, 300, 400};
  EXPECT_EQ(*ChoosePassCount(s, t, 1.0), 2);
  EXPECT_EQ(*ChoosePassCount(s, t, 100.0), 3);
  EXPECT_EQ(*ChoosePassCount(s, t, 0.01), 0);
  EXPECT_FALSE(ChoosePassCount(s, std::vector<double>{1, 2}, 1.0).ok());
  EXPECT_FALSE(ChoosePassCount(s, t, 0.0).ok());
}

// Auto mode: the first solves run at max_passes and calibrate; then I* takes over. A layer
// time far beyond the solve time picks the first pass count that reaches the best balance the
// calibration saw; a layer time far below it charges every pass heavily and picks no more.
TEST(ReliefSolverTest, AutoPassesCalibrateThenFix) {
  Rng rng(8);
  std::vector<double> mean;
  const Placement p = testing::TopologyPlacement(rng, DefaultTopology(16).value(), 64, 2, &mean);
  std::vector<std::vector<int64_t>> steps;
  for (int i = 0; i < 6; ++i) steps.push_back(testing::RandomStep(rng, mean, 1024));

  auto slow_layer = Make({.auto_passes = true, .max_passes = 24, .t_moe_us = 1e9,
                          .calibration_steps = 4});
  ASSERT_TRUE(slow_layer->SetPlacement(p).ok());
  EXPECT_TRUE(slow_layer->calibrating());
  EXPECT_EQ(slow_layer->passes(), 24);
  Split split;
  std::vector<double> mean_curve(25, 0.0), curve(25);
  auto probe = Make({});
  ASSERT_TRUE(probe->SetPlacement(p).ok());
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(slow_layer->Solve(steps[i], &split).ok());
    EXPECT_EQ(split.passes, 24);
    ASSERT_TRUE(probe->RecordBalanceCurve(steps[i], curve).ok());
    for (int k = 0; k < 25; ++k) mean_curve[k] += curve[k] / 4;
  }
  EXPECT_FALSE(slow_layer->calibrating());
  int first_best = 0;
  for (int k = 0; k < 25; ++k) {
    if (mean_curve[k] > mean_curve[first_best] * (1 + 1e-9)) first_best = k;
  }
  // Time still costs a hair at T = 1e9 us, so I* is the first pass count at the best balance
  // (within rounding of the mean).
  EXPECT_LE(std::abs(slow_layer->passes() - first_best), 1) << first_best;
  ASSERT_TRUE(slow_layer->Solve(steps[4], &split).ok());
  EXPECT_EQ(split.passes, slow_layer->passes());

  auto fast_layer = Make({.auto_passes = true, .max_passes = 24, .t_moe_us = 1e-6,
                          .calibration_steps = 2});
  ASSERT_TRUE(fast_layer->SetPlacement(p).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(fast_layer->Solve(steps[i], &split).ok());
  EXPECT_FALSE(fast_layer->calibrating());
  // Beyond the slow layer's I* the balance no longer improves while the time still grows, so
  // a shorter layer never picks more passes (both saw the same calibration steps).
  EXPECT_LE(fast_layer->passes(), slow_layer->passes());
}

}  // namespace
}  // namespace gcmoe::balancer
