// The CUDA backend against the CPU backend on the same inputs (DESIGN.md §4: calc_diff < 1e-4,
// no NaN), on a small model: routing patterns (empty experts, every token on one expert,
// unused slots), request and output dtypes, ring-slot reuse, the sequential fallback, abort,
// determinism and the errors a step can return.
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <unistd.h>

#include <cmath>
#include <random>
#include <tuple>

#include "tests/kernels/gpu_test_util.h"
#include "tools/bench_random_weights.h"

namespace gcmoe::kernels_test {
namespace {

using engine::DType;
using engine::StepOutput;

engine::ModelSpec SmallModel(bool shared) {
  engine::ModelSpec spec;
  spec.hidden = 256;
  spec.intermediate = 128;
  spec.num_experts = 8;
  spec.top_k = 4;
  spec.num_layers = 1;
  spec.shared_intermediate = shared ? 128 : 0;
  spec.activation_alpha = 1.0f;
  spec.activation_clamp = 10.0f;
  spec.weights = "synthetic:1";
  return spec;
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  }
  uint64_t generation_ = 0;
};

TEST_F(CudaBackendTest, RoutingPatternsMatchCpu) {
  for (bool shared : {false, true}) {
    const engine::ModelSpec spec = SmallModel(shared);
    server::RandomCodeWeightSource weights(spec, 11);
    auto pair = BackendPair::Create(spec, 64, weights);
    ASSERT_NE(pair, nullptr);
    std::mt19937_64 rng(5);
    for (Routing routing : {Routing::kUniform, Routing::kFirstHalf, Routing::kOneExpert,
                            Routing::kUnusedSlots, Routing::kAllOnOneExpert}) {
      for (int tokens : {1, 7, 33, 64}) {
        const StepInputs in = MakeInputs(spec, tokens, DType::kBF16, routing, &rng);
        ExpectMatch(pair.get(), in, ++generation_,
                    "shared " + std::to_string(shared) + " routing " +
                        std::to_string(static_cast<int>(routing)) + " T " + std::to_string(tokens));
      }
    }
  }
}

// role2 at every block size (the mma.sync kernel at 8-32, the wgmma kernel at 64), so every MMA
// width of the valid-M sizing (8..64) and both weight formats run; K = 128 and 256 give one- and
// two-chunk tasks, so the stage ring wraps inside and across tasks.
TEST_F(CudaBackendTest, EveryBlockSizeMatchesCpu) {
  for (bool shared : {false, true}) {
    const engine::ModelSpec spec = SmallModel(shared);
    server::RandomCodeWeightSource weights(spec, 13);
    auto pair = BackendPair::Create(spec, 64, weights);
    ASSERT_NE(pair, nullptr);
    std::mt19937_64 rng(7);
    for (int bm : {8, 16, 32, 64}) {
      ASSERT_TRUE(pair->cuda()->ForceBlockRows(bm).ok());
      for (int tokens : {1, 7, 33, 64}) {
        const StepInputs in = MakeInputs(spec, tokens, DType::kBF16, Routing::kUniform, &rng);
        ExpectMatch(pair.get(), in, ++generation_,
                    "shared " + std::to_string(shared) + " BM " + std::to_string(bm) + " T " +
                        std::to_string(tokens));
      }
    }
  }
}

TEST_F(CudaBackendTest, RequestAndOutputDtypesMatchCpu) {
  const engine::ModelSpec spec = SmallModel(true);
  server::RandomCodeWeightSource weights(spec, 12);
  auto pair = BackendPair::Create(spec, 32, weights);
  ASSERT_NE(pair, nullptr);
  std::mt19937_64 rng(6);
  for (DType dtype : {DType::kBF16, DType::kFP32, DType::kFP16, DType::kFP8E4M3}) {
    for (bool fp32_out : {false, true}) {
      StepInputs in = MakeInputs(spec, 16, dtype, Routing::kUniform, &rng);
      in.output_fp32 = fp32_out;
      ExpectMatch(pair.get(), in, ++generation_,
                  "dtype " + std::to_string(static_cast<int>(dtype)) + " fp32 out " +
                      std::to_string(fp32_out));
    }
  }
}

TEST_F(CudaBackendTest, EmptyStepAndAllSlotsUnused) {
  const engine::ModelSpec spec = SmallModel(false);
  server::RandomCodeWeightSource weights(spec, 13);
  auto pair = BackendPair::Create(spec, 16, weights);
  ASSERT_NE(pair, nullptr);
  std::mt19937_64 rng(7);
  StepInputs empty = MakeInputs(spec, 0, DType::kBF16, Routing::kUniform, &rng);
  StepOutput out;
  ASSERT_TRUE(pair->Run(pair->cuda(), empty, ++generation_, &out).ok());
  EXPECT_TRUE(out.output.empty());
  // Tokens whose every slot is unused get exactly zero (no shared expert).
  StepInputs unused = MakeInputs(spec, 5, DType::kBF16, Routing::kUniform, &rng);
  std::fill(unused.topk_ids.begin(), unused.topk_ids.end(), -1);
  ASSERT_TRUE(pair->Run(pair->cuda(), unused, ++generation_, &out).ok());
  for (double v : OutputValues(out, false)) ASSERT_EQ(v, 0.0);
  EXPECT_EQ(out.assignments_computed, 0);
}

TEST_F(CudaBackendTest, RingSlotReuseMatchesCpu) {
  // Two ring slots for up to 32 blocks: role1 must wait for role2 to release each slot.
  const engine::ModelSpec spec = SmallModel(true);
  server::RandomCodeWeightSource weights(spec, 14);
  auto pair = BackendPair::Create(spec, 64, weights, {.ring_blocks = 2});
  ASSERT_NE(pair, nullptr);
  std::mt19937_64 rng(8);
  for (Routing routing : {Routing::kUniform, Routing::kAllOnOneExpert, Routing::kUnusedSlots}) {
    for (int tokens : {3, 64}) {
      const StepInputs in = MakeInputs(spec, tokens, DType::kBF16, routing, &rng);
      ExpectMatch(pair.get(), in, ++generation_, "ring reuse T " + std::to_string(tokens));
    }
  }
}

// The wgmma kernel at BM 64 computes an expert's last block of up to 16 rows with the full
// block before it (RingBlock::tail_rows): expert 1 takes every token's first slot, so T = 70 and
// 80 leave tails of 6 and 16 rows (merged, the second at the widest MMA), 81 one of 17 (not
// merged), 140 a third block of 12 (merged) and 150 one of 22. With two ring slots the tail's
// slot is reused too.
TEST_F(CudaBackendTest, WgmmaMergedTailsMatchCpu) {
  const engine::ModelSpec spec = SmallModel(false);
  server::RandomCodeWeightSource weights(spec, 19);
  std::mt19937_64 rng(13);
  for (int ring : {0, 2}) {
    auto pair = BackendPair::Create(spec, 160, weights, {.ring_blocks = ring});
    ASSERT_NE(pair, nullptr);
    ASSERT_TRUE(pair->cuda()->ForceBlockRows(64).ok());
    for (Routing routing : {Routing::kOneExpert, Routing::kAllOnOneExpert}) {
      for (int tokens : {70, 80, 81, 140, 150}) {
        const StepInputs in = MakeInputs(spec, tokens, DType::kBF16, routing, &rng);
        ExpectMatch(pair.get(), in, ++generation_,
                    "ring blocks " + std::to_string(ring) + " T " + std::to_string(tokens));
      }
    }
  }
}

// Roles overlapped on two partitions, in sequence on the compute partition, and in sequence on
// every SM without a partition (the service default): the same bits.
TEST_F(CudaBackendTest, SequentialModeMatchesConcurrentBitForBit) {
  const engine::ModelSpec spec = SmallModel(true);
  server::RandomCodeWeightSource weights(spec, 15);
  auto concurrent = BackendPair::Create(spec, 48, weights);
  auto sequential = BackendPair::Create(spec, 48, weights, {.overlap_roles = "off"});
  auto unpartitioned = BackendPair::Create(spec, 48, weights, {}, 0);
  ASSERT_NE(concurrent, nullptr);
  ASSERT_NE(sequential, nullptr);
  ASSERT_NE(unpartitioned, nullptr);
  EXPECT_FALSE(concurrent->cuda()->sequential());
  EXPECT_TRUE(sequential->cuda()->sequential());
  EXPECT_TRUE(unpartitioned->cuda()->sequential());
  EXPECT_EQ(unpartitioned->cuda()->partitions().dispatch_sms, 0);
  std::mt19937_64 rng(9);
  for (int tokens : {2, 48}) {
    const StepInputs in = MakeInputs(spec, tokens, DType::kBF16, Routing::kUniform, &rng);
    const StepOutput a = ExpectMatch(concurrent.get(), in, ++generation_, "concurrent");
    const StepOutput b = ExpectMatch(sequential.get(), in, ++generation_, "sequential");
    EXPECT_EQ(a.output, b.output);
    const StepOutput u = ExpectMatch(unpartitioned.get(), in, ++generation_, "no partition");
    EXPECT_EQ(a.output, u.output);
    // And the same inputs again: deterministic.
    StepOutput c;
    ASSERT_TRUE(concurrent->Run(concurrent->cuda(), in, ++generation_, &c).ok());
    EXPECT_EQ(a.output, c.output);
  }
}

TEST_F(CudaBackendTest, AbortedStepReturnsAbortedAndTheNextStepRuns) {
  const engine::ModelSpec spec = SmallModel(false);
  server::RandomCodeWeightSource weights(spec, 16);
  auto pair = BackendPair::Create(spec, 16, weights);
  ASSERT_NE(pair, nullptr);
  std::mt19937_64 rng(10);
  const StepInputs in = MakeInputs(spec, 16, DType::kBF16, Routing::kUniform, &rng);
  const uint64_t aborted = ++generation_;
  pair->cuda()->Abort(aborted);
  StepOutput out;
  const Status s = pair->Run(pair->cuda(), in, aborted, &out);
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  ExpectMatch(pair.get(), in, ++generation_, "after abort");
}

// Delegates to random-code weights with every block scale code (routed and shared) raised by
// `raise`, then expert 3's routed W2 block 5 set to `high` and block 6 to `low` (0: left).
class ScaledWeights final : public engine::WeightSource {
 public:
  ScaledWeights(const engine::ModelSpec& spec, int raise, uint8_t high = 0, uint8_t low = 0)
      : inner_(spec, 19), raise_(raise), high_(high), low_(low) {}
  const engine::ModelSpec& spec() const override { return inner_.spec(); }
  std::string Describe() const override { return inner_.Describe(); }
  Result<engine::ExpertWeights> LoadExpert(int layer, int expert) const override {
    auto w = inner_.LoadExpert(layer, expert);
    if (!w.ok()) return w;
    Raise(&w->w1_scales);
    Raise(&w->w2_scales);
    if (expert == 3 && high_ != 0) w->w2_scales[5] = high_;
    if (expert == 3 && low_ != 0) w->w2_scales[6] = low_;
    return w;
  }
  Result<engine::SharedExpertWeights> LoadShared(int layer) const override {
    auto w = inner_.LoadShared(layer);
    if (!w.ok()) return w;
    Raise(&w->w1_scales);
    Raise(&w->w2_scales);
    return w;
  }
  Result<engine::DenseExpertWeights> LoadExpertDense(int layer, int expert) const override {
    return inner_.LoadExpertDense(layer, expert);
  }
  Result<engine::DenseExpertWeights> LoadSharedDense(int layer) const override {
    return inner_.LoadSharedDense(layer);
  }
  Status CheckExperts(const std::vector<int>& layers,
                      const std::vector<int>& experts) const override {
    return inner_.CheckExperts(layers, experts);
  }

 private:
  void Raise(std::vector<uint8_t>* scales) const {
    for (uint8_t& code : *scales) code = static_cast<uint8_t>(code + raise_);
  }
  server::RandomCodeWeightSource inner_;
  int raise_;
  uint8_t high_;
  uint8_t low_;
};

// role2 folds each block scale into a BF16 multiplier, which holds routed scales up to
// 2 (UE8M0 code 128) and shared ones up to 2^7: matrices with larger scales load with their codes
// lowered and the results raised back, exactly, so they match the CPU backend as any other. Here
// every scale is 2^12 times the generator's (all above the limit), and then one block of expert
// 3's W2 is 2^73 (that matrix shifted by 72).
TEST_F(CudaBackendTest, LargeBlockScalesAreShiftedExactly) {
  for (bool shared : {false, true}) {
    for (uint8_t high : {uint8_t{0}, uint8_t{200}}) {
      const engine::ModelSpec spec = SmallModel(shared);
      ScaledWeights weights(spec, 12, high);
      auto pair = BackendPair::Create(spec, 64, weights);
      ASSERT_NE(pair, nullptr);
      std::mt19937_64 rng(14);
      for (int tokens : {7, 64}) {
        for (Routing routing : {Routing::kUniform, Routing::kAllOnOneExpert}) {
          const StepInputs in = MakeInputs(spec, tokens, DType::kBF16, routing, &rng);
          ExpectMatch(pair.get(), in, ++generation_,
                      "shared " + std::to_string(shared) + " high " + std::to_string(high) + " T " +
                          std::to_string(tokens));
        }
      }
    }
  }
}

// Only a matrix whose block scales span more than BF16 can hold (2^-126 next to 2^127) is
// refused, at load, naming the matrix and the way out (the cpu backend).
TEST_F(CudaBackendTest, ScalesWiderThanBf16AreRefused) {
  const engine::ModelSpec spec = SmallModel(false);
  std::vector<int> all(spec.num_experts);
  for (int e = 0; e < spec.num_experts; ++e) all[e] = e;
  const ScaledWeights weights(spec, 0, 254, 1);
  engine::BackendOptions options;
  options.model = spec;
  options.max_tokens_per_rank = 8;
  options.instance = "gcmoe-gputest-bf16-scales-" + std::to_string(getpid());
  auto backend = engine::CudaBackend::Create(options);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  const Status loaded = (*backend)->LoadExperts(weights, all);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.message().find("expert 3 of layer 0 W2"), std::string::npos)
      << loaded.message();
  EXPECT_NE(loaded.message().find("cpu backend"), std::string::npos) << loaded.message();
}

TEST_F(CudaBackendTest, StepErrorsNameTheProblem) {
  const engine::ModelSpec spec = SmallModel(false);
  server::RandomCodeWeightSource weights(spec, 17);
  auto pair = BackendPair::Create(spec, 8, weights);
  ASSERT_NE(pair, nullptr);
  std::mt19937_64 rng(11);
  StepOutput out;
  const StepInputs big = MakeInputs(spec, 9, DType::kBF16, Routing::kUniform, &rng);
  EXPECT_EQ(pair->Run(pair->cuda(), big, ++generation_, &out).code(),
            StatusCode::kResourceExhausted);
  StepInputs bad = MakeInputs(spec, 2, DType::kBF16, Routing::kUniform, &rng);
  bad.topk_ids[3] = spec.num_experts;  // out of range
  // The plan is built from the ids, so a bad id is refused before the backend (plan build) or
  // by the backend's own check; either way the step fails with InvalidArgument.
  EXPECT_EQ(pair->Run(pair->cuda(), bad, ++generation_, &out).code(), StatusCode::kInvalidArgument);
}

// What the rank reports as gcmoe_gpu_memory_used_bytes: the device's total and what is in use,
// which grows by what this process allocates (the driver's granularity aside) and never falls
// below the weights the backend holds; the CPU backend reports nothing.
TEST_F(CudaBackendTest, DeviceMemoryFollowsAllocations) {
  const engine::ModelSpec spec = SmallModel(true);
  server::RandomCodeWeightSource weights(spec, 19);
  auto pair = BackendPair::Create(spec, 64, weights);
  ASSERT_NE(pair, nullptr);
  engine::DeviceMemory none;
  EXPECT_FALSE(pair->cpu()->QueryDeviceMemory(&none));

  engine::DeviceMemory before;
  ASSERT_TRUE(pair->cuda()->QueryDeviceMemory(&before));
  int device = -1;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, device), cudaSuccess);
  EXPECT_EQ(before.device, device);
  EXPECT_EQ(before.total_bytes, static_cast<int64_t>(prop.totalGlobalMem));
  EXPECT_GT(before.used_bytes, 0);
  EXPECT_LT(before.used_bytes, before.total_bytes);

  constexpr int64_t kBlock = int64_t{1} << 30;
  void* block = nullptr;
  ASSERT_EQ(cudaMalloc(&block, kBlock), cudaSuccess);
  engine::DeviceMemory after;
  const bool queried = pair->cuda()->QueryDeviceMemory(&after);
  cudaFree(block);
  ASSERT_TRUE(queried);
  // Another process may allocate or free meanwhile; on a GPU of our own the growth is the block
  // rounded up to the driver's 2 MiB pages.
  EXPECT_GE(after.used_bytes - before.used_bytes, kBlock);
  EXPECT_LE(after.used_bytes - before.used_bytes, kBlock + (int64_t{64} << 20));
}

// Small enough for compute-sanitizer (bench/gpu_checks.sh runs it there).
TEST_F(CudaBackendTest, SanitizerCase) {
  const engine::ModelSpec spec = SmallModel(true);
  server::RandomCodeWeightSource weights(spec, 18);
  auto pair = BackendPair::Create(spec, 16, weights);
  ASSERT_NE(pair, nullptr);
  std::mt19937_64 rng(12);
  for (Routing routing : {Routing::kUniform, Routing::kUnusedSlots}) {
    const StepInputs in = MakeInputs(spec, 9, DType::kBF16, routing, &rng);
    ExpectMatch(pair.get(), in, ++generation_, "sanitizer case");
  }
  // The wgmma kernel's own ring, warpgroups and row order (BM 64), routed and shared.
  auto wide = BackendPair::Create(spec, 16, weights);
  ASSERT_NE(wide, nullptr);
  ASSERT_TRUE(wide->cuda()->ForceBlockRows(64).ok());
  const StepInputs in = MakeInputs(spec, 9, DType::kBF16, Routing::kUniform, &rng);
  ExpectMatch(wide.get(), in, ++generation_, "sanitizer case, wgmma BM 64");
  // Without the shared expert, a merged tail (expert 1's 70 rows: 64 + 6).
  const engine::ModelSpec routed = SmallModel(false);
  server::RandomCodeWeightSource routed_weights(routed, 18);
  auto merged = BackendPair::Create(routed, 80, routed_weights);
  ASSERT_NE(merged, nullptr);
  ASSERT_TRUE(merged->cuda()->ForceBlockRows(64).ok());
  const StepInputs tail = MakeInputs(routed, 70, DType::kBF16, Routing::kOneExpert, &rng);
  ExpectMatch(merged.get(), tail, ++generation_, "sanitizer case, wgmma merged tail");
  // Zero-padded H, I and I_s with expert biases and the gpt-oss activation, on both kernels
  // (cuda_backend_shapes_test.cc): the padded row pitches and the bias reads.
  const engine::ModelSpec padded = GptOssStyleModel(160, 96, 8, 4, 224);
  server::RandomCodeWeightSource padded_weights(padded, 18, /*biases=*/true);
  auto odd = BackendPair::Create(padded, 16, padded_weights);
  ASSERT_NE(odd, nullptr);
  for (int bm : {16, 64}) {
    ASSERT_TRUE(odd->cuda()->ForceBlockRows(bm).ok());
    const StepInputs in = MakeInputs(padded, 9, DType::kBF16, Routing::kUniform, &rng);
    ExpectMatch(odd.get(), in, ++generation_, "sanitizer case, padded with biases");
  }
}

}  // namespace
}  // namespace gcmoe::kernels_test
