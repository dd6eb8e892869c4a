// Pipelined steps (Backend::Launch before the step before it finishes): the same bytes as one
// step at a time, each step's value checks its own, and the contract's refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "tests/kernels/gpu_test_util.h"
#include "tools/bench_random_weights.h"

namespace gcmoe::kernels_test {
namespace {

constexpr int kCapacity = 96;

// Steps of every size class, input dtype and output dtype, in an order that changes them often.
std::vector<StepInputs> MixedSteps(const engine::ModelSpec& spec, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<StepInputs> steps;
  for (int i = 0; i < count; ++i) {
    const int tokens = 1 + static_cast<int>(rng() % kCapacity);
    const engine::DType dtype = i % 3 == 1 ? engine::DType::kFP32 : engine::DType::kBF16;
    StepInputs in = MakeInputs(spec, tokens, dtype,
                               i % 4 == 0 ? Routing::kUnusedSlots : Routing::kUniform, &rng);
    in.output_fp32 = i % 5 == 2;
    steps.push_back(std::move(in));
  }
  return steps;
}

TEST(CudaBackendPipeline, StepsLaunchedBehindEachOtherGiveTheBytesOfOneAtATime) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  const engine::ModelSpec spec = SmallSharedExpertModel();
  server::RandomCodeWeightSource weights(spec, 7);
  // Without a dispatch partition, as the service runs by default, and with one.
  for (const int dispatch_sms : {0, 16}) {
    SCOPED_TRACE("dispatch_sms " + std::to_string(dispatch_sms));
    auto pair = BackendPair::Create(spec, kCapacity, weights, {}, dispatch_sms);
    ASSERT_NE(pair, nullptr);
    engine::CudaBackend* cuda = pair->cuda();
    ASSERT_TRUE(cuda->pipelines());
    const std::vector<StepInputs> steps = MixedSteps(spec, 120, 5);
    uint64_t generation = 0;

    std::vector<engine::StepOutput> alone(steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      ASSERT_TRUE(pair->Run(cuda, steps[i], ++generation, &alone[i]).ok()) << "step " << i;
    }

    // Step i + 1 is launched before step i finishes, the way a rank runs them when the next
    // step arrives while one is on the device.
    std::vector<engine::StepOutput> pipelined(steps.size());
    std::vector<uint64_t> generations(steps.size());
    for (size_t i = 0; i <= steps.size(); ++i) {
      if (i < steps.size()) {
        generations[i] = ++generation;
        auto ctx = pair->Context(steps[i], generations[i]);
        ASSERT_TRUE(ctx.ok());
        cuda->PrefetchInputs(*ctx);
        const Status launched = cuda->Launch(*ctx, &pipelined[i]);
        ASSERT_TRUE(launched.ok()) << "step " << i << ": " << launched.ToString();
      }
      if (i > 0) {
        const Status finished = cuda->Finish(generations[i - 1], &pipelined[i - 1]);
        ASSERT_TRUE(finished.ok()) << "step " << i - 1 << ": " << finished.ToString();
        EXPECT_TRUE(cuda->Done(generations[i - 1]));
      }
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      EXPECT_EQ(pipelined[i].output, alone[i].output) << "step " << i;
      EXPECT_EQ(pipelined[i].assignments_computed, alone[i].assignments_computed) << "step " << i;
      EXPECT_GT(pipelined[i].device_ns, 0) << "step " << i;
    }
    // And against the CPU backend, for a few: not only self-consistent.
    for (size_t i = 0; i < steps.size(); i += 17) {
      engine::StepOutput cpu;
      ASSERT_TRUE(pair->Run(pair->cpu(), steps[i], ++generation, &cpu).ok());
      EXPECT_LT(CalcDiff(OutputValues(cpu, steps[i].output_fp32),
                         OutputValues(pipelined[i], steps[i].output_fp32)),
                1e-4)
          << "step " << i;
    }
  }
}

// A device buffer holding `values` as BF16, freed at scope end.
struct DeviceBf16 {
  explicit DeviceBf16(const std::vector<uint8_t>& bf16) {
    EXPECT_EQ(cudaMalloc(&data, bf16.size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data, bf16.data(), bf16.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBf16() { cudaFree(data); }
  void* data = nullptr;
};

TEST(CudaBackendPipeline, EachStepGetsItsOwnValueChecksAndOutputs) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  const engine::ModelSpec spec = SmallSharedExpertModel();
  server::RandomCodeWeightSource weights(spec, 9);
  auto pair = BackendPair::Create(spec, kCapacity, weights, {}, 0);
  ASSERT_NE(pair, nullptr);
  engine::CudaBackend* cuda = pair->cuda();
  std::mt19937_64 rng(3);
  const int H = spec.hidden;
  // Step A: 40 rows in three ranges, its activations in GPU memory with a NaN at row 21,
  // column 5 (the second range), the output of rows 8..23 to GPU memory. Step B: 30 rows, clean,
  // in GPU memory too.
  StepInputs a = MakeInputs(spec, 40, engine::DType::kBF16, Routing::kUniform, &rng);
  StepInputs b = MakeInputs(spec, 30, engine::DType::kBF16, Routing::kUniform, &rng);
  const int64_t nan_index = 21 * H + 5;
  std::vector<uint8_t> a_bad = a.hidden;
  const uint16_t nan_bits = 0x7fc0;
  std::memcpy(a_bad.data() + 2 * nan_index, &nan_bits, 2);
  DeviceBf16 a_device(a_bad), b_device(b.hidden);
  void* a_out = nullptr;
  ASSERT_EQ(cudaMalloc(&a_out, 16 * H * 2), cudaSuccess);
  uint8_t* const a_rows = static_cast<uint8_t*>(a_device.data);
  const engine::DeviceRows a_ranges[3] = {{0, 8, a_rows, nullptr},
                                          {8, 16, a_rows + 8 * H * 2, a_out},
                                          {24, 16, a_rows + 24 * H * 2, nullptr}};
  const engine::DeviceRows b_ranges[1] = {{0, 30, b_device.data, nullptr}};

  // Alone first (reference bytes), each with its own generation.
  uint64_t generation = 100;
  engine::StepOutput a_alone, b_alone;
  {
    auto ctx = pair->Context(a, ++generation);
    ASSERT_TRUE(ctx.ok());
    ctx->hidden.data = nullptr;
    ctx->device_rows = a_ranges;
    ASSERT_TRUE(cuda->Step(*ctx, &a_alone).ok());
  }
  std::vector<uint8_t> a_out_alone(16 * H * 2);
  ASSERT_EQ(cudaMemcpy(a_out_alone.data(), a_out, a_out_alone.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  {
    auto ctx = pair->Context(b, ++generation);
    ASSERT_TRUE(ctx.ok());
    ctx->hidden.data = nullptr;
    ctx->device_rows = b_ranges;
    ASSERT_TRUE(cuda->Step(*ctx, &b_alone).ok());
  }
  ASSERT_EQ(a_alone.device_faults.size(), 3u);
  EXPECT_EQ(a_alone.device_faults[1].hidden.index, nan_index - 8 * H);
  EXPECT_TRUE(std::isnan(a_alone.device_faults[1].hidden.value));
  ASSERT_EQ(cudaMemset(a_out, 0, a_out_alone.size()), cudaSuccess);

  // B launched behind A, then a third launch refused while both are unfinished, A finished
  // before B; then the order refused the other way round.
  engine::StepOutput a_piped, b_piped, refused;
  const uint64_t ga = ++generation, gb = ++generation;
  auto actx = pair->Context(a, ga);
  ASSERT_TRUE(actx.ok());
  actx->hidden.data = nullptr;
  actx->device_rows = a_ranges;
  ASSERT_TRUE(cuda->Launch(*actx, &a_piped).ok());
  auto bctx = pair->Context(b, gb);
  ASSERT_TRUE(bctx.ok());
  bctx->hidden.data = nullptr;
  bctx->device_rows = b_ranges;
  cuda->PrefetchInputs(*bctx);
  ASSERT_TRUE(cuda->Launch(*bctx, &b_piped).ok());
  auto third = pair->Context(b, ++generation);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(cuda->Launch(*third, &refused).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(cuda->Finish(gb, &b_piped).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(cuda->Finish(ga, &a_piped).ok());
  ASSERT_TRUE(cuda->Finish(gb, &b_piped).ok());
  EXPECT_EQ(cuda->Finish(gb, &b_piped).code(), StatusCode::kFailedPrecondition);

  ASSERT_EQ(a_piped.device_faults.size(), 3u);
  ASSERT_EQ(b_piped.device_faults.size(), 1u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a_piped.device_faults[i].hidden.index, a_alone.device_faults[i].hidden.index) << i;
    EXPECT_EQ(a_piped.device_faults[i].output.index, a_alone.device_faults[i].output.index) << i;
  }
  EXPECT_EQ(b_piped.device_faults[0].hidden.index, -1);
  EXPECT_EQ(b_piped.device_faults[0].output.index, -1);
  std::vector<uint8_t> a_out_piped(16 * H * 2);
  ASSERT_EQ(cudaMemcpy(a_out_piped.data(), a_out, a_out_piped.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(a_out_piped, a_out_alone);
  // The host rows of A (0..7 and 24..39; rows 8..23 went to GPU memory) and all of B.
  const size_t row = static_cast<size_t>(H) * 2;
  EXPECT_TRUE(
      std::equal(a_piped.output.begin(), a_piped.output.begin() + 8 * row, a_alone.output.begin()));
  EXPECT_TRUE(std::equal(a_piped.output.begin() + 24 * row, a_piped.output.end(),
                         a_alone.output.begin() + 24 * row));
  EXPECT_EQ(b_piped.output, b_alone.output);
  cudaFree(a_out);
}

}  // namespace
}  // namespace gcmoe::kernels_test
