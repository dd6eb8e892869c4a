// The green-context pair on the device: the driver-aligned split (112 + 20 on a 132-SM H200 for
// a request of 16), disjoint partitions, the cross-partition handshake as two graph roots, and
// the layer's role1/role2 CTAs on disjoint SMs.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "kernels/green_context.h"
#include "kernels/green_context_probe.h"
#include "tests/kernels/gpu_test_util.h"
#include "tools/bench_random_weights.h"

namespace gcmoe::kernels_test {
namespace {

using kernels::GreenContextPair;

const GreenContextPair* Pair(int request) {
  const GreenContextPair* pair = nullptr;
  std::string error;
  const cudaError_t err = kernels::GetGreenContextPair(0, request, &pair, &error);
  EXPECT_EQ(err, cudaSuccess) << error;
  return err == cudaSuccess ? pair : nullptr;
}

TEST(GreenContext, SplitIsDriverAligned) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  for (int request : {16, 4}) {
    const GreenContextPair* pair = Pair(request);
    ASSERT_NE(pair, nullptr);
    ASSERT_TRUE(pair->green) << pair->fallback_reason;
    const int align = std::max(1, pair->alignment_sms);
    EXPECT_EQ(pair->compute_sms + pair->dispatch_sms, pair->total_sms);
    EXPECT_EQ(pair->compute_sms, (pair->total_sms - request) / align * align);
    EXPECT_GE(pair->compute_sms, 32);
    std::printf("request %d: %d SMs = %d compute + %d dispatch (min partition %d, alignment %d)\n",
                request, pair->total_sms, pair->compute_sms, pair->dispatch_sms,
                pair->min_partition_sms, pair->alignment_sms);
    if (pair->total_sms == 132) {  // the H200 of DESIGN.md §6
      EXPECT_EQ(pair->compute_sms, request == 16 ? 112 : 128);
      EXPECT_EQ(pair->dispatch_sms, request == 16 ? 20 : 4);
    }
  }
}

TEST(GreenContext, CachedPerRequest) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  EXPECT_EQ(Pair(16), Pair(16));
}

TEST(GreenContext, ImpossibleRequestIsAClearError) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  const GreenContextPair* pair = nullptr;
  std::string error;
  EXPECT_NE(kernels::GetGreenContextPair(0, 120, &pair, &error), cudaSuccess);
  EXPECT_NE(error.find("compute SMs"), std::string::npos) << error;
}

TEST(GreenContext, HandshakeAcrossPartitionsOnDisjointSms) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  const GreenContextPair* pair = Pair(16);
  ASSERT_NE(pair, nullptr);
  kernels::PartitionProbeResult probe;
  ASSERT_EQ(kernels::RunPartitionProbe(*pair, 20, 2'000'000'000ull, &probe), cudaSuccess);
  EXPECT_TRUE(probe.handshake_completed);
  const std::set<int> compute(probe.compute_sm_ids.begin(), probe.compute_sm_ids.end());
  const std::set<int> dispatch(probe.dispatch_sm_ids.begin(), probe.dispatch_sm_ids.end());
  for (int sm : dispatch) EXPECT_EQ(compute.count(sm), 0u) << "SM " << sm << " in both";
  EXPECT_LE(static_cast<int>(dispatch.size()), pair->dispatch_sms);
  EXPECT_LE(static_cast<int>(compute.size()), pair->compute_sms);
}

TEST(GreenContext, LayerRolesRunOnDisjointPartitions) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  engine::ModelSpec spec;
  spec.hidden = 512;
  spec.intermediate = 256;
  spec.num_experts = 16;
  spec.top_k = 4;
  spec.num_layers = 1;
  spec.weights = "synthetic:1";
  server::RandomCodeWeightSource weights(spec, 51);
  auto pair = BackendPair::Create(spec, 64, weights, {.record_sm_ids = true});
  ASSERT_NE(pair, nullptr);
  ASSERT_FALSE(pair->cuda()->sequential());
  std::mt19937_64 rng(52);
  const StepInputs in = MakeInputs(spec, 64, engine::DType::kBF16, Routing::kUniform, &rng);
  engine::StepOutput out;
  ASSERT_TRUE(pair->Run(pair->cuda(), in, 1, &out).ok());
  std::vector<int> role1, role2;
  ASSERT_TRUE(pair->cuda()->ReadSmIds(&role1, &role2).ok());
  const std::set<int> a(role1.begin(), role1.end());
  const std::set<int> b(role2.begin(), role2.end());
  for (int sm : a) EXPECT_EQ(b.count(sm), 0u) << "SM " << sm << " ran role1 and role2";
  EXPECT_LE(static_cast<int>(a.size()), pair->cuda()->partitions().dispatch_sms);
  std::printf("role1 on %zu SMs, role2 on %zu SMs\n", a.size(), b.size());
}

}  // namespace
}  // namespace gcmoe::kernels_test
