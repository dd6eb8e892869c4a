// CreateCudaBackend's refusals, which need no GPU (run everywhere).
#include <gtest/gtest.h>

#include <utility>

#include "engine/backend.h"
#include "engine/cuda_backend.h"
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

TEST(CudaBackendCreate, Role2KernelIsBf16WgmmaUnlessGcmoeCudaGemmNamesAnother) {
  using kernels::GemmKernel;
  const auto chosen = [](const char* requested) {
    auto kernel = ChooseRole2Kernel(requested);
    EXPECT_TRUE(kernel.ok()) << kernel.status().ToString();
    return kernel.ok() ? *kernel : GemmKernel::kStreamWgmma;
  };
  EXPECT_EQ(chosen(nullptr), GemmKernel::kWgmmaBf16);
  EXPECT_EQ(chosen(""), GemmKernel::kWgmmaBf16);
  EXPECT_EQ(chosen("stream"), GemmKernel::kStreamMma);
  EXPECT_EQ(chosen("mma"), GemmKernel::kMmaSync);
  EXPECT_EQ(chosen("wgmma"), GemmKernel::kStreamWgmma);
  EXPECT_EQ(chosen("bf16"), GemmKernel::kStreamBf16);
  EXPECT_EQ(chosen("bf16-wgmma"), GemmKernel::kWgmmaBf16);
  auto unknown = ChooseRole2Kernel("cutlass");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("GCMOE_CUDA_GEMM"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("cutlass"), std::string::npos);
}

TEST(CudaBackendCreate, UnknownRole2KernelIsRejectedBeforeAnyDeviceWork) {
  BackendOptions o = Options();
  o.role2_kernel = "cutlass";
  auto backend = CreateCudaBackend(o);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kInvalidArgument) << backend.status().ToString();
  EXPECT_NE(backend.status().message().find("cutlass"), std::string::npos);
}

// The sweep behind the choice (docs/PERFORMANCE.md, "Block size"): the block size measured
// fastest at each mean of rows per expert, GLM-5.2 and DeepSeek-V4.1-Flash slices on an H200.
TEST(CudaBackendBlockRows, MatchesTheMeasuredFastestBlockSize) {
  using kernels::GemmKernel;
  const std::pair<double, int> fp8[] = {{2, 8}, {4, 8}, {8, 16}, {16, 16}, {32, 32}, {64, 64}};
  for (const auto& [mean, bm] : fp8) {
    EXPECT_EQ(BlockRowsForMeanRows(GemmKernel::kStreamMma, mean), bm) << mean;
  }
  EXPECT_EQ(BlockRowsForMeanRows(GemmKernel::kStreamMma, 1000.0), 64);
  const std::pair<double, int> bf16[] = {{0.5, 8}, {1, 16},  {2, 16},  {4, 16},
                                         {8, 16},  {16, 32}, {32, 32}, {64, 32}};
  for (const auto& [mean, bm] : bf16) {
    EXPECT_EQ(BlockRowsForMeanRows(GemmKernel::kStreamBf16, mean), bm) << mean;
  }
  // `bf16-wgmma`: bf16's sizes, and its own kernel at BM 64 once a block fills.
  const std::pair<double, int> wide[] = {{0.5, 8}, {8, 16}, {16, 32}, {22, 32}, {32, 64}, {64, 64}};
  for (const auto& [mean, bm] : wide) {
    EXPECT_EQ(BlockRowsForMeanRows(GemmKernel::kWgmmaBf16, mean), bm) << mean;
  }
  for (GemmKernel kernel :
       {GemmKernel::kStreamMma, GemmKernel::kStreamBf16, GemmKernel::kWgmmaBf16}) {
    EXPECT_EQ(BlockRowsForMeanRows(kernel, 0.0), 8);
    // Never smaller for more rows.
    int last = 8;
    for (double mean = 0; mean < 200; mean += 0.25) {
      EXPECT_GE(BlockRowsForMeanRows(kernel, mean), last) << mean;
      last = BlockRowsForMeanRows(kernel, mean);
    }
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

TEST(CudaBackendCreate, HiddenNotAMultipleOf128IsRejected) {
  BackendOptions o = Options();
  o.model.hidden = 96;
  auto backend = CreateCudaBackend(o);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(backend.status().message().find("multiples of 128"), std::string::npos);
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
