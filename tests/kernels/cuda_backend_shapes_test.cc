// The CUDA backend against the CPU backend (DESIGN.md §4: calc_diff < 1e-4, no NaN) on the
// shapes and math of real checkpoints: H, I and I_s that are multiples of 32 but not of 128,
// which the GPU runs zero-padded (DESIGN.md §6), expert biases b1 and b2, and the gpt-oss
// activation (clamp, alpha 1.702, up offset 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "tests/kernels/gpu_test_util.h"
#include "tools/bench_random_weights.h"

namespace gcmoe::kernels_test {
namespace {

using engine::DType;

class CudaBackendShapesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  }
  uint64_t generation_ = 0;
};

// Both backends over `spec` and `weights` at every block size (mma.sync at 8-32, wgmma at 64),
// uniform routing, each token count.
void MatchAtEveryBlockSize(const engine::ModelSpec& spec, const engine::WeightSource& weights,
                           std::initializer_list<int> token_counts, uint64_t seed,
                           const std::string& label, uint64_t* generation) {
  int capacity = 0;
  for (int tokens : token_counts) capacity = std::max(capacity, tokens);
  auto pair = BackendPair::Create(spec, capacity, weights);
  ASSERT_NE(pair, nullptr);
  std::mt19937_64 rng(seed);
  for (int bm : {8, 16, 32, 64}) {
    ASSERT_TRUE(pair->cuda()->ForceBlockRows(bm).ok());
    for (int tokens : token_counts) {
      const StepInputs in = MakeInputs(spec, tokens, DType::kBF16, Routing::kUniform, &rng);
      ExpectMatch(pair.get(), in, ++*generation,
                  label + ", BM " + std::to_string(bm) + " T " + std::to_string(tokens));
    }
  }
}

// gpt-oss's own H = I = 2880 (22.5 x 128) with its biases and activation, over the padded K and
// rows of both kernels.
TEST_F(CudaBackendShapesTest, GptOssShapeWithBiasesMatchesCpu) {
  const engine::ModelSpec spec = GptOssStyleModel(2880, 2880, 4, 2, 0);
  server::RandomCodeWeightSource weights(spec, 21, /*biases=*/true);
  MatchAtEveryBlockSize(spec, weights, {3, 48}, 21, "H = I = 2880", &generation_);
}

// Every request and output dtype on padded H (160), I (96) and I_s (224), with biases and the
// shared expert. The tokens fill the capacity and the dtypes alternate, so each dtype's rows
// (another pitch in the device input buffer) must not see the padding columns another dtype's
// rows left there.
TEST_F(CudaBackendShapesTest, PaddedShapesEveryDtypeMatchesCpu) {
  const engine::ModelSpec spec = GptOssStyleModel(160, 96, 8, 4, 224);
  server::RandomCodeWeightSource weights(spec, 22, /*biases=*/true);
  auto pair = BackendPair::Create(spec, 32, weights);
  ASSERT_NE(pair, nullptr);
  std::mt19937_64 rng(22);
  for (int round = 0; round < 2; ++round) {
    for (DType dtype : {DType::kFP32, DType::kBF16, DType::kFP8E4M3, DType::kFP16}) {
      for (bool fp32_out : {false, true}) {
        StepInputs in = MakeInputs(spec, 32 - 5 * round, dtype, Routing::kUniform, &rng);
        in.output_fp32 = fp32_out;
        ExpectMatch(pair.get(), in, ++generation_,
                    "dtype " + std::to_string(static_cast<int>(dtype)) + " fp32 out " +
                        std::to_string(fp32_out) + " round " + std::to_string(round));
      }
    }
  }
}

// Padded shapes at every block size and routing pattern, with and without the shared expert
// (I_s % 128 != 0) and with and without biases.
TEST_F(CudaBackendShapesTest, PaddedShapesEveryBlockSizeMatchesCpu) {
  for (int shared : {0, 96}) {
    for (bool biases : {false, true}) {
      const engine::ModelSpec spec = GptOssStyleModel(416, 160, 8, 4, shared);
      server::RandomCodeWeightSource weights(spec, 23, biases);
      auto pair = BackendPair::Create(spec, 64, weights);
      ASSERT_NE(pair, nullptr);
      std::mt19937_64 rng(23);
      for (int bm : {8, 16, 32, 64}) {
        ASSERT_TRUE(pair->cuda()->ForceBlockRows(bm).ok());
        for (Routing routing : {Routing::kUniform, Routing::kUnusedSlots}) {
          for (int tokens : {1, 19, 64}) {
            const StepInputs in = MakeInputs(spec, tokens, DType::kBF16, routing, &rng);
            ExpectMatch(pair.get(), in, ++generation_,
                        "I_s " + std::to_string(shared) + " biases " + std::to_string(biases) +
                            " BM " + std::to_string(bm) + " routing " +
                            std::to_string(static_cast<int>(routing)) + " T " +
                            std::to_string(tokens));
          }
        }
      }
    }
  }
}

// Biases and the up offset on shapes the kernels tile without padding, and the W2 biases of a
// merged tail block (its rows' routing weights follow the block's: RingBlock::tail_rows):
// expert 1 takes every token's first slot, T = 70 leaves a tail of 6 rows.
TEST_F(CudaBackendShapesTest, BiasesOnAlignedShapesAndMergedTailsMatchCpu) {
  const engine::ModelSpec spec = GptOssStyleModel(256, 128, 8, 4, 0);
  server::RandomCodeWeightSource weights(spec, 24, /*biases=*/true);
  MatchAtEveryBlockSize(spec, weights, {1, 33, 80}, 24, "aligned", &generation_);
  auto pair = BackendPair::Create(spec, 80, weights);
  ASSERT_NE(pair, nullptr);
  std::mt19937_64 rng(24);
  ASSERT_TRUE(pair->cuda()->ForceBlockRows(64).ok());
  for (Routing routing : {Routing::kOneExpert, Routing::kAllOnOneExpert}) {
    const StepInputs in = MakeInputs(spec, 70, DType::kBF16, routing, &rng);
    ExpectMatch(pair.get(), in, ++generation_,
                "merged tail, routing " + std::to_string(static_cast<int>(routing)));
  }
}

// A bias that decides the result: W1 all zero codes, so a = b1 exactly and the layer's output is
// the biases through the activation; the CUDA backend must agree with the CPU's in that regime
// too (a dropped or misplaced bias would give zero or another feature's value).
TEST_F(CudaBackendShapesTest, BiasesAloneMatchCpu) {
  const engine::ModelSpec spec = GptOssStyleModel(160, 96, 4, 2, 0);

  // The random source's experts with every W1 code zero.
  class ZeroW1 final : public engine::WeightSource {
   public:
    explicit ZeroW1(const engine::ModelSpec& spec) : codes_(spec, 25, /*biases=*/true) {}
    const engine::ModelSpec& spec() const override { return codes_.spec(); }
    std::string Describe() const override { return "zero-w1"; }
    Result<engine::ExpertWeights> LoadExpert(int layer, int expert) const override {
      GCMOE_ASSIGN_OR_RETURN(engine::ExpertWeights w, codes_.LoadExpert(layer, expert));
      std::fill(w.w1.begin(), w.w1.end(), uint8_t{0});
      return w;
    }
    Result<engine::SharedExpertWeights> LoadShared(int layer) const override {
      return codes_.LoadShared(layer);
    }
    Result<engine::DenseExpertWeights> LoadExpertDense(int layer, int expert) const override {
      return codes_.LoadExpertDense(layer, expert);
    }
    Result<engine::DenseExpertWeights> LoadSharedDense(int layer) const override {
      return codes_.LoadSharedDense(layer);
    }
    Status CheckExperts(const std::vector<int>& layers,
                        const std::vector<int>& experts) const override {
      return codes_.CheckExperts(layers, experts);
    }

   private:
    server::RandomCodeWeightSource codes_;
  };
  const ZeroW1 weights(spec);
  auto pair = BackendPair::Create(spec, 16, weights);
  ASSERT_NE(pair, nullptr);
  std::mt19937_64 rng(25);
  for (int bm : {16, 64}) {
    ASSERT_TRUE(pair->cuda()->ForceBlockRows(bm).ok());
    const StepInputs in = MakeInputs(spec, 16, DType::kBF16, Routing::kUniform, &rng);
    ExpectMatch(pair.get(), in, ++generation_, "zero W1, BM " + std::to_string(bm));
  }
}

}  // namespace
}  // namespace gcmoe::kernels_test
