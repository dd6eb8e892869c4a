// Graph replays: 1,000 steps with changing inputs, each against the CPU backend, and 1,000 pure
// graph replays (no host reset between them) after which the same step gives the same bits.
#include <gtest/gtest.h>

#include <random>

#include "tests/kernels/gpu_test_util.h"
#include "tools/bench_random_weights.h"

namespace gcmoe::kernels_test {
namespace {

TEST(CudaBackendReplay, ThousandStepsWithChangingInputsMatchCpu) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  const engine::ModelSpec spec = SmallSharedExpertModel();
  server::RandomCodeWeightSource weights(spec, 41);
  auto pair = BackendPair::Create(spec, 96, weights);
  ASSERT_NE(pair, nullptr);
  std::mt19937_64 rng(42);
  StepInputs first;
  engine::StepOutput first_out;
  double worst = 0.0;
  int block_sizes_seen = 0;
  for (int step = 0; step < 1000; ++step) {
    const int tokens = 1 + static_cast<int>(rng() % 96);
    const Routing routing = step % 3 == 0 ? Routing::kUnusedSlots : Routing::kUniform;
    const StepInputs in = MakeInputs(spec, tokens, engine::DType::kBF16, routing, &rng);
    engine::StepOutput cpu, gpu;
    ASSERT_TRUE(pair->Run(pair->cpu(), in, step + 1, &cpu).ok());
    const Status s = pair->Run(pair->cuda(), in, step + 1, &gpu);
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.ToString();
    const auto y = OutputValues(gpu, false);
    ASSERT_TRUE(AllFinite(y)) << "step " << step;
    const double diff = CalcDiff(OutputValues(cpu, false), y);
    ASSERT_LT(diff, 1e-4) << "step " << step << " T " << tokens;
    worst = std::max(worst, diff);
    block_sizes_seen |= pair->cuda()->last_block_rows();
    if (step == 0) {
      first = in;
      first_out = gpu;
    }
  }
  // No drift: the first step's inputs give the first step's bits after 1,000 replays.
  engine::StepOutput again;
  ASSERT_TRUE(pair->Run(pair->cuda(), first, 1001, &again).ok());
  EXPECT_EQ(again.output, first_out.output);
  std::printf("1000 steps: worst calc_diff %.3e, block sizes used (mask) %d\n", worst,
              block_sizes_seen);
}

TEST(CudaBackendReplay, ThousandGraphReplaysLeaveNoState) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  const engine::ModelSpec spec = SmallSharedExpertModel();
  server::RandomCodeWeightSource weights(spec, 43);
  auto pair = BackendPair::Create(spec, 64, weights, {.ring_blocks = 3});
  ASSERT_NE(pair, nullptr);
  std::mt19937_64 rng(44);
  const StepInputs in = MakeInputs(spec, 64, engine::DType::kBF16, Routing::kUniform, &rng);
  engine::StepOutput before, after;
  ASSERT_TRUE(pair->Run(pair->cuda(), in, 1, &before).ok());
  auto times = pair->cuda()->TimeReplays(0, 1000);
  ASSERT_TRUE(times.ok()) << times.status().ToString();
  EXPECT_EQ(times->size(), 1000u);
  ASSERT_TRUE(pair->Run(pair->cuda(), in, 2, &after).ok());
  EXPECT_EQ(before.output, after.output);
  engine::StepOutput cpu;
  ASSERT_TRUE(pair->Run(pair->cpu(), in, 2, &cpu).ok());
  EXPECT_LT(CalcDiff(OutputValues(cpu, false), OutputValues(after, false)), 1e-4);
}

}  // namespace
}  // namespace gcmoe::kernels_test
