// Expert parallelism across GPUs (one rank engine per GPU, every GPU of the machine, in one
// process): the same request through P ranks is bit-identical to one rank on one GPU, for the
// fused GC-MoE exchange (peer memory) and for the NCCL all-to-all baseline, with and without
// Relief splitting replicated experts; and within calc_diff 1e-4 of the CPU backend. Skips on
// machines with fewer than two GPUs.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "engine/numerics.h"
#include "tests/engine/rank_world.h"
#include "tests/engine/tiny_model.h"
#include "tests/kernels/gpu_test_util.h"

namespace gcmoe::engine::testing_util {
namespace {

int GpuCount() {
  if (!kernels_test::HasGpu()) return 0;
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess ? devices : 0;
}

constexpr int kPerRank = 64;  // tokens per rank at most

class MultiGpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    world_size_ = std::min(GpuCount(), 8);
    if (world_size_ < 2) return;
    auto make = [](const std::string& backend, int P, const std::string& exchange, bool relief) {
      WorldOptions options;
      options.world_size = P;
      options.capacity = kPerRank * world_size_;
      options.backend = backend;
      options.exchange = exchange;
      options.relief = relief;
      options.threads = 2;
      auto world = RankWorld::Create(TinyModel("synthetic:3"), options);
      EXPECT_TRUE(world.ok()) << backend << " P " << P << " " << exchange
                              << (relief ? "+relief" : "") << ": " << world.status().ToString();
      return world.ok() ? std::move(world).value() : nullptr;
    };
    worlds_["cpu"] = make("cpu", 1, "gcmoe", false);
    worlds_["cuda1"] = make("cuda", 1, "gcmoe", false);
    worlds_["gcmoe"] = make("cuda", world_size_, "gcmoe", false);
    worlds_["gcmoe+relief"] = make("cuda", world_size_, "gcmoe", true);
    worlds_["nccl"] = make("cuda", world_size_, "nccl", false);
    worlds_["nccl+relief"] = make("cuda", world_size_, "nccl", true);
  }
  static void TearDownTestSuite() { worlds_.clear(); }
  void SetUp() override {
    if (world_size_ < 2) {
      GTEST_SKIP() << "fewer than two CUDA devices on this machine (multi-GPU test skipped)";
    }
    for (const auto& [name, world] : worlds_) ASSERT_NE(world, nullptr) << name;
  }
  static int world_size_;
  static std::map<std::string, std::unique_ptr<RankWorld>> worlds_;
};
int MultiGpuTest::world_size_ = 0;
std::map<std::string, std::unique_ptr<RankWorld>> MultiGpuTest::worlds_;

TEST_F(MultiGpuTest, PRanksAreBitIdenticalToOneGpuAndMatchCpu) {
  const ModelSpec spec = TinyModel("synthetic:3");
  int cases = 0;
  uint64_t seed = 100;
  for (Routing routing : {Routing::kRandom, Routing::kUnusedSlots, Routing::kOneHotExpert}) {
    for (int per_rank : {1, 7, 33, kPerRank}) {
      for (DType dtype : {DType::kBF16, DType::kFP8E4M3}) {
        GlobalRequest request = MakeRequest(spec, per_rank * world_size_, routing, ++seed);
        SetDType(&request, dtype);
        request.output_fp32 = true;
        const std::string label = "routing " + std::to_string(static_cast<int>(routing)) +
                                  " T/rank " + std::to_string(per_rank) + " dtype " +
                                  std::to_string(static_cast<int>(dtype));
        auto cpu = worlds_["cpu"]->Forward(request);
        ASSERT_TRUE(cpu.ok()) << label << ": " << cpu.status().ToString();
        auto one = worlds_["cuda1"]->Forward(request);
        ASSERT_TRUE(one.ok()) << label << ": " << one.status().ToString();
        const double diff = numerics::CalcDiff(numerics::OutputToDoubles(*cpu, true).data(),
                                               numerics::OutputToDoubles(*one, true).data(),
                                               static_cast<long>(cpu->size() / 4));
        EXPECT_LT(diff, 1e-4) << label << ": one GPU against the CPU backend";
        for (const char* name : {"gcmoe", "gcmoe+relief", "nccl", "nccl+relief"}) {
          auto many = worlds_[name]->Forward(request);
          ASSERT_TRUE(many.ok()) << label << " " << name << ": " << many.status().ToString();
          ASSERT_EQ(many->size(), one->size()) << label << " " << name;
          EXPECT_EQ(std::memcmp(many->data(), one->data(), one->size()), 0)
              << label << " " << name << ": P = " << world_size_
              << " differs from P = 1 on one GPU";
        }
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 24);
}

TEST_F(MultiGpuTest, ReliefMovesTokensToTheHostCopies) {
  // Every token's first slot on expert 0, which the fitted placement replicates: without a
  // split its home rank computes all of them; Relief hands about half to the host copy.
  const ModelSpec spec = TinyModel("synthetic:3");
  GlobalRequest request = MakeRequest(spec, kPerRank * world_size_, Routing::kOneHotExpert, 7);
  request.output_fp32 = true;
  auto one = worlds_["cuda1"]->Forward(request);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  for (const char* name : {"gcmoe+relief", "nccl+relief"}) {
    RankWorld& world = *worlds_[name];
    const balancer::Placement& placement = world.engine(0).placement();
    int replicated = 0;
    for (int e = 0; e < placement.num_experts; ++e) replicated += placement.host[e] >= 0;
    EXPECT_GT(replicated, 0) << name << ": the fitted placement replicates nothing";
    auto many = world.Forward(request);
    ASSERT_TRUE(many.ok()) << name << ": " << many.status().ToString();
    EXPECT_EQ(std::memcmp(many->data(), one->data(), one->size()), 0) << name;
    const StepStats& stats = world.last_stats(0);
    ASSERT_EQ(static_cast<int>(stats.load_before.size()), world_size_);
    const int64_t peak_before = *std::max_element(stats.load_before.begin(), stats.load_before.end());
    const int64_t peak_after = *std::max_element(stats.load_after.begin(), stats.load_after.end());
    EXPECT_LT(peak_after, peak_before) << name << ": Relief did not lower the peak rank load";
    int64_t computed = 0;
    for (int r = 0; r < world_size_; ++r) computed += world.last_stats(r).assignments_computed;
    int64_t routed = 0;
    for (int32_t e : request.ids) routed += e >= 0;
    // Every routed assignment computed exactly once, somewhere.
    EXPECT_EQ(computed, routed) << name;
  }
}

}  // namespace
}  // namespace gcmoe::engine::testing_util
