// WeightSource::Open and the synthetic source: determinism, independence of experts, value
// statistics, and quantization at load exactly as the numerics define it.
#include "engine/weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "engine/numerics.h"
#include "tests/engine/tiny_model.h"

namespace gcmoe::engine {
namespace {

using ::testing::HasSubstr;
using testing_util::TinyModel;

std::unique_ptr<WeightSource> OpenOrDie(const ModelSpec& spec) {
  auto source = WeightSource::Open(spec);
  EXPECT_TRUE(source.ok()) << source.status().ToString();
  return source.ok() ? std::move(source).value() : nullptr;
}

TEST(SyntheticWeights, DeterministicAndEachExpertIndependent) {
  auto a = OpenOrDie(TinyModel("synthetic:7", 2));
  auto b = OpenOrDie(TinyModel("synthetic:7", 2));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->Describe(), "synthetic:7");
  // `a` generates every expert in order; `b` generates expert 11 of layer 1 alone, first.
  auto alone = b->LoadExpert(1, 11);
  ASSERT_TRUE(alone.ok());
  for (int e = 0; e < 16; ++e) ASSERT_TRUE(a->LoadExpert(1, e).ok());
  auto again = a->LoadExpert(1, 11);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(alone->w1, again->w1);
  EXPECT_EQ(alone->w1_scales, again->w1_scales);
  EXPECT_EQ(alone->w2, again->w2);
  EXPECT_EQ(alone->w2_scales, again->w2_scales);
}

TEST(SyntheticWeights, SeedLayerExpertAndMatrixAllChangeTheValues) {
  auto a = OpenOrDie(TinyModel("synthetic:7", 2));
  auto b = OpenOrDie(TinyModel("synthetic:8", 2));
  const auto base = a->LoadExpertDense(0, 3);
  ASSERT_TRUE(base.ok());
  EXPECT_NE(base->w1, b->LoadExpertDense(0, 3)->w1);
  EXPECT_NE(base->w1, a->LoadExpertDense(1, 3)->w1);
  EXPECT_NE(base->w1, a->LoadExpertDense(0, 4)->w1);
  // w2 is [H, I] and w1 [2I, H]: with H = 2I they have the same element count.
  ASSERT_EQ(base->w1.size(), base->w2.size() * 2);
  EXPECT_FALSE(std::equal(base->w2.begin(), base->w2.end(), base->w1.begin()));
  const auto shared = a->LoadSharedDense(0);
  ASSERT_TRUE(shared.ok());
  EXPECT_NE(shared->w1, base->w1);
}

TEST(SyntheticWeights, ValueStatistics) {
  const ModelSpec spec = TinyModel();
  auto source = OpenOrDie(spec);
  ASSERT_TRUE(source);
  const auto dense = source->LoadExpertDense(0, 0);
  ASSERT_TRUE(dense.ok());
  ASSERT_EQ(dense->w1.size(), size_t{2 * 128 * 256});
  ASSERT_EQ(dense->w2.size(), size_t{256 * 128});
  // Rows are N(0, 1/fan_in) times 2^u, u ~ U[-1, 1]: E[4^u] = (4 - 1/4) / (2 ln 4).
  const double row_power = 3.75 / (2.0 * std::log(4.0));
  auto check = [&](const std::vector<float>& w, int fan_in) {
    double sum = 0.0, sum_sq = 0.0;
    for (float v : w) {
      ASSERT_TRUE(std::isfinite(v));
      sum += v;
      sum_sq += static_cast<double>(v) * v;
    }
    const double n = static_cast<double>(w.size());
    EXPECT_NEAR(sum / n, 0.0, 0.02 / std::sqrt(fan_in));
    EXPECT_NEAR(sum_sq / n * fan_in, row_power, 0.1 * row_power);
  };
  check(dense->w1, spec.hidden);
  check(dense->w2, spec.intermediate);
  // Row factors make the block scales differ between rows.
  const auto q = source->LoadExpert(0, 0);
  ASSERT_TRUE(q.ok());
  std::set<uint8_t> codes(q->w1_scales.begin(), q->w1_scales.end());
  EXPECT_GE(codes.size(), 3u);
}

TEST(SyntheticWeights, QuantizedAtLoadRowByRow) {
  const ModelSpec spec = TinyModel();
  auto source = OpenOrDie(spec);
  ASSERT_TRUE(source);
  const auto dense = source->LoadExpertDense(0, 5);
  const auto q = source->LoadExpert(0, 5);
  ASSERT_TRUE(dense.ok() && q.ok());
  const int H = spec.hidden, I = spec.intermediate;
  ASSERT_EQ(q->w1.size(), size_t(2 * I * H / 2));
  ASSERT_EQ(q->w1_scales.size(), size_t(2 * I * H / 32));
  ASSERT_EQ(q->w2.size(), size_t(H * I / 2));
  ASSERT_EQ(q->w2_scales.size(), size_t(H * I / 32));
  std::vector<uint8_t> codes(H / 2), scales(H / 32);
  for (int r = 0; r < 2 * I; ++r) {
    numerics::QuantizeE2M1K32(dense->w1.data() + r * H, H, codes.data(), scales.data());
    ASSERT_TRUE(std::equal(codes.begin(), codes.end(), q->w1.begin() + r * H / 2)) << r;
    ASSERT_TRUE(std::equal(scales.begin(), scales.end(), q->w1_scales.begin() + r * H / 32));
  }
  const auto shared_dense = source->LoadSharedDense(0);
  const auto shared = source->LoadShared(0);
  ASSERT_TRUE(shared_dense.ok() && shared.ok());
  std::vector<uint8_t> fp8(I), fp8_scales(I / 32);
  for (int r = 0; r < H; ++r) {
    numerics::QuantizeE4M3K32(shared_dense->w2.data() + r * I, I, fp8.data(), fp8_scales.data());
    ASSERT_TRUE(std::equal(fp8.begin(), fp8.end(), shared->w2.begin() + r * I)) << r;
    ASSERT_TRUE(std::equal(fp8_scales.begin(), fp8_scales.end(),
                           shared->w2_scales.begin() + r * I / 32));
  }
}

TEST(WeightSourceOpen, RejectsBadSpecs) {
  auto bad_seed = WeightSource::Open(TinyModel("synthetic:12x"));
  ASSERT_FALSE(bad_seed.ok());
  EXPECT_EQ(bad_seed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_seed.status().message(), HasSubstr("bad seed"));
  EXPECT_FALSE(WeightSource::Open(TinyModel("synthetic:")).ok());
  EXPECT_FALSE(WeightSource::Open(TinyModel("synthetic:99999999999999999999999")).ok());

  ModelSpec odd = TinyModel();
  odd.hidden = 100;
  auto invalid = WeightSource::Open(odd);
  ASSERT_FALSE(invalid.ok());
  EXPECT_THAT(invalid.status().message(), HasSubstr("hidden"));

  auto missing = WeightSource::Open(TinyModel("/nonexistent/dir/model.safetensors"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("cannot open"));
}

TEST(WeightSourceOpen, IndexErrors) {
  ModelSpec spec = TinyModel("synthetic:1", 2);
  spec.shared_intermediate = 0;
  auto source = OpenOrDie(spec);
  ASSERT_TRUE(source);
  EXPECT_THAT(source->LoadExpert(2, 0).status().message(), HasSubstr("layer 2 out of range"));
  EXPECT_THAT(source->LoadExpert(0, 16).status().message(), HasSubstr("expert 16 out of range"));
  EXPECT_THAT(source->LoadExpert(0, -1).status().message(), HasSubstr("expert -1 out of range"));
  EXPECT_EQ(source->LoadShared(0).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(source->CheckExperts({0, 1}, {0, 15}).ok());
  EXPECT_FALSE(source->CheckExperts({0}, {16}).ok());
}

}  // namespace
}  // namespace gcmoe::engine
