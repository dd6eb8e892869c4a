// The CUDA backend against the CPU backend on one rank's share of an EP-8 layer of the paper's
// models (GLM-5.2: H 6144, I 2048, 32 local experts, top-8; DeepSeek-V4.1-Flash: H 5120,
// I 2304, 48 local experts, top-6), shared expert off and on, T = 1, 2, 4, ..., 256 tokens.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "tests/kernels/gpu_test_util.h"
#include "tools/bench_random_weights.h"

namespace gcmoe::kernels_test {
namespace {

struct Slice {
  const char* name;
  int hidden, intermediate, experts, top_k;
};
constexpr Slice kGlm{"glm-5.2", 6144, 2048, 32, 8};
constexpr Slice kDeepSeek{"deepseek-v4.1-flash", 5120, 2304, 48, 6};

void SweepSlice(const Slice& slice, bool shared) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  engine::ModelSpec spec;
  spec.hidden = slice.hidden;
  spec.intermediate = slice.intermediate;
  spec.num_experts = slice.experts;
  spec.top_k = slice.top_k;
  spec.num_layers = 1;
  spec.shared_intermediate = shared ? slice.intermediate : 0;
  spec.activation_alpha = 1.0f;
  spec.activation_clamp = 10.0f;
  spec.weights = "synthetic:1";
  server::RandomCodeWeightSource weights(spec, 21);
  auto pair = BackendPair::Create(spec, 256, weights);
  ASSERT_NE(pair, nullptr);
  std::mt19937_64 rng(31);
  uint64_t generation = 0;
  for (int tokens = 1; tokens <= 256; tokens *= 2) {
    const StepInputs in = MakeInputs(spec, tokens, engine::DType::kBF16, Routing::kUniform, &rng);
    engine::StepOutput cpu, gpu;
    ++generation;
    ASSERT_TRUE(pair->Run(pair->cpu(), in, generation, &cpu).ok());
    const Status s = pair->Run(pair->cuda(), in, generation, &gpu);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const auto x = OutputValues(cpu, false);
    const auto y = OutputValues(gpu, false);
    const double diff = CalcDiff(x, y);
    std::printf("%-20s shared %d  T %3d  BM %2d  assignments %5lld  calc_diff %.3e\n", slice.name,
                shared, tokens, pair->cuda()->last_block_rows(),
                static_cast<long long>(gpu.assignments_computed), diff);
    EXPECT_TRUE(AllFinite(y)) << "T " << tokens;
    EXPECT_LT(diff, 1e-4) << "T " << tokens;
    EXPECT_EQ(cpu.assignments_computed, gpu.assignments_computed);
  }
}

TEST(CudaBackendSlices, Glm52RoutedOnly) { SweepSlice(kGlm, false); }
TEST(CudaBackendSlices, Glm52WithSharedExpert) { SweepSlice(kGlm, true); }
TEST(CudaBackendSlices, DeepSeekV41FlashRoutedOnly) { SweepSlice(kDeepSeek, false); }
TEST(CudaBackendSlices, DeepSeekV41FlashWithSharedExpert) { SweepSlice(kDeepSeek, true); }

}  // namespace
}  // namespace gcmoe::kernels_test
