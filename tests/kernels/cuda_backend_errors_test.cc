// CreateCudaBackend's refusals, which need no GPU (run everywhere).
#include <gtest/gtest.h>

#include <utility>

#include "engine/backend.h"
#include "engine/cuda_backend.h"
#include "engine/cuda_error.h"
#include "tests/kernels/gpu_test_util.h"

namespace gcmoe::engine {
namespace {

BackendOptions Options() {
  BackendOptions o;
  o.model.hidden = 256;
  o.model.intermediate = 128;
  o.model.num_experts = 8;
  o.model.top_k = 2;
  o.model.num_layers = 1;
  o.model.weights = "synthetic:1";
  o.max_tokens_per_rank = 16;
  return o;
}

TEST(CudaBackendCreate, RanksOutsideOneHostAreRejected) {
  // Checked before any device is touched, so the same answer with or without a GPU.
  for (const auto& [world, rank] : {std::pair{9, 0}, std::pair{2, 2}, std::pair{2, -1}}) {
    BackendOptions o = Options();
    o.world_size = world;
    o.rank = rank;
    auto backend = CreateCudaBackend(o);
    ASSERT_FALSE(backend.ok());
    EXPECT_EQ(backend.status().code(), StatusCode::kInvalidArgument) << backend.status().ToString();
    EXPECT_NE(backend.status().message().find("GPU ranks"), std::string::npos);
  }
}

// The errors after which the process's CUDA context is gone (a rank then exits to be restarted),
// against those after which it goes on (CUDA runtime API documentation, cudaError).
TEST(CudaErrors, OnlyContextBreakingErrorsAreSticky) {
  for (cudaError_t err : {cudaErrorIllegalAddress, cudaErrorLaunchFailure,
                          cudaErrorMisalignedAddress, cudaErrorIllegalInstruction,
                          cudaErrorHardwareStackError, cudaErrorAssert, cudaErrorECCUncorrectable}) {
    EXPECT_TRUE(IsStickyCudaError(err)) << cudaGetErrorName(err);
  }
  for (cudaError_t err : {cudaSuccess, cudaErrorNotReady, cudaErrorMemoryAllocation,
                          cudaErrorInvalidValue, cudaErrorNoDevice, cudaErrorLaunchOutOfResources,
                          cudaErrorInvalidConfiguration}) {
    EXPECT_FALSE(IsStickyCudaError(err)) << cudaGetErrorName(err);
  }
}

TEST(CudaBackendCreate, BadTuningIsRejectedBeforeAnyDeviceWork) {
  BackendOptions o = Options();
  o.cuda.overlap_roles = "sometimes";
  auto backend = CreateCudaBackend(o);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kInvalidArgument) << backend.status().ToString();
  EXPECT_NE(backend.status().message().find("sometimes"), std::string::npos);
  o = Options();
  o.cuda.wait_sleep_cap_ns = 100;
  backend = CreateCudaBackend(o);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kInvalidArgument) << backend.status().ToString();
  EXPECT_NE(backend.status().message().find("wait_sleep_cap_ns"), std::string::npos);
}

// The sweep behind the choice (docs/DESIGN-NOTES.md, block size): the block size measured
// fastest at each mean of rows per expert, GLM-5.2 and DeepSeek-V4.1-Flash slices on an H200.
TEST(CudaBackendBlockRows, MatchesTheMeasuredFastestBlockSize) {
  const std::pair<double, int> measured[] = {{0.5, 8},  {1, 16},  {2, 16},  {4, 16}, {8, 16},
                                             {16, 32}, {22, 32}, {32, 64}, {64, 64}};
  for (const auto& [mean, bm] : measured) {
    EXPECT_EQ(BlockRowsForMeanRows(mean), bm) << mean;
  }
  EXPECT_EQ(BlockRowsForMeanRows(0.0), 8);
  EXPECT_EQ(BlockRowsForMeanRows(1000.0), 64);
  // Never smaller for more rows.
  int last = 8;
  for (double mean = 0; mean < 200; mean += 0.25) {
    EXPECT_GE(BlockRowsForMeanRows(mean), last) << mean;
    last = BlockRowsForMeanRows(mean);
  }
}

TEST(CudaBackendCreate, UnknownExchangeIsRejected) {
  BackendOptions o = Options();
  o.exchange = "mpi";
  auto backend = CreateCudaBackend(o);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(backend.status().message().find("engine.exchange"), std::string::npos);
}

TEST(CudaBackendCreate, WithoutAGpuItIsUnavailable) {
  if (kernels_test::HasGpu()) {
    auto backend = CreateCudaBackend(Options());
    EXPECT_TRUE(backend.ok()) << backend.status().ToString();
    return;
  }
  auto backend = CreateCudaBackend(Options());
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kUnavailable) << backend.status().ToString();
  EXPECT_NE(backend.status().message().find("no usable CUDA device"), std::string::npos);
}

}  // namespace
}  // namespace gcmoe::engine
