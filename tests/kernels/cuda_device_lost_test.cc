// Once a kernel faults, the CUDA context of the process is unusable for good: the backend must
// say so (Backend::device_lost, which makes a rank exit to be restarted) and refuse later steps
// at once, while an ordinary failed step leaves it usable. Its own binary: the fault breaks the
// context of every later test in the process.
#include <gtest/gtest.h>

#include <random>

#include "engine/cuda_error.h"
#include "tests/kernels/fault_kernel.h"
#include "tests/kernels/gpu_test_util.h"
#include "tools/bench_random_weights.h"

namespace gcmoe::kernels_test {
namespace {

TEST(CudaDeviceLostTest, AFaultMarksTheDeviceLostAndLaterStepsFailAtOnce) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  engine::ModelSpec spec = GptOssStyleModel(256, 128, 8, 2, 0);
  server::RandomCodeWeightSource weights(spec, 3);
  auto pair = BackendPair::Create(spec, 32, weights);
  ASSERT_NE(pair, nullptr);
  std::mt19937_64 rng(1);
  const StepInputs in = MakeInputs(spec, 16, engine::DType::kBF16, Routing::kUniform, &rng);
  engine::StepOutput out;
  ASSERT_TRUE(pair->Run(pair->cuda(), in, 1, &out).ok());
  EXPECT_EQ(pair->cuda()->device_lost(), "");

  // An invalid request fails the step but loses nothing.
  StepInputs bad = in;
  bad.topk_ids[0] = spec.num_experts;
  const Status refused = pair->Run(pair->cuda(), bad, 2, &out);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.ToString();
  EXPECT_EQ(pair->cuda()->device_lost(), "");
  ASSERT_TRUE(pair->Run(pair->cuda(), in, 3, &out).ok());

  const cudaError_t fault = LaunchFaultingKernel();
  ASSERT_EQ(fault, cudaErrorIllegalAddress) << cudaGetErrorString(fault);
  ASSERT_TRUE(engine::IsStickyCudaError(fault));

  const Status failed = pair->Run(pair->cuda(), in, 4, &out);
  EXPECT_EQ(failed.code(), StatusCode::kInternal) << failed.ToString();
  const std::string lost = pair->cuda()->device_lost();
  EXPECT_NE(lost.find("cudaErrorIllegalAddress"), std::string::npos) << lost;

  const Status again = pair->Run(pair->cuda(), in, 5, &out);
  EXPECT_EQ(again.code(), StatusCode::kInternal);
  EXPECT_NE(again.message().find("unusable for this process"), std::string::npos)
      << again.ToString();
  EXPECT_NE(again.message().find("cudaErrorIllegalAddress"), std::string::npos)
      << again.ToString();
  // The CPU backend has no device to lose.
  EXPECT_EQ(pair->cpu()->device_lost(), "");
}

}  // namespace
}  // namespace gcmoe::kernels_test
