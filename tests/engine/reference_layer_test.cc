// A whole MoE layer assembled from RoutedExpertFfn and SharedExpertFfn per DESIGN.md §4 (step 5
// in FP32, slot order, then the shared partial; output rounded to BF16), against the float64
// references: quantization-aware (calc_diff < 1e-4) and unquantized (calc_diff < 0.02,
// cosine >= 0.97), for T = 1..64 unit-scale tokens, from float and from FP8 input.
#include "engine/reference_layer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>

#include "engine/expert_ffn.h"
#include "engine/numerics.h"
#include "tests/engine/cached_weights.h"
#include "tests/engine/tiny_model.h"

namespace gcmoe::engine {
namespace {

using testing_util::TinyModel;

struct Batch {
  int tokens = 0;
  std::vector<float> hidden;        // [T, H]
  std::vector<uint8_t> fp8;         // [T, H] E4M3 of hidden
  std::vector<uint8_t> fp8_scales;  // [T, H/32]
  std::vector<int32_t> ids;         // [T, k]
  std::vector<float> weights;       // [T, k]
};

// Unit-scale activations, k distinct experts per token with softmax-like weights; every 7th
// token leaves its last slot unused (-1).
Batch RandomBatch(const ModelSpec& spec, int tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Batch b;
  b.tokens = tokens;
  const int H = spec.hidden, k = spec.top_k;
  b.hidden.resize(static_cast<size_t>(tokens) * H);
  for (float& v : b.hidden) v = normal(rng);
  b.fp8.resize(b.hidden.size());
  b.fp8_scales.resize(b.hidden.size() / 32);
  for (int t = 0; t < tokens; ++t) {
    numerics::QuantizeE4M3K32(b.hidden.data() + t * H, H, b.fp8.data() + t * H,
                              b.fp8_scales.data() + t * H / 32);
  }
  std::vector<int> experts(spec.num_experts);
  std::iota(experts.begin(), experts.end(), 0);
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(experts.begin(), experts.end(), rng);
    std::vector<float> logits(k);
    float sum = 0.0f;
    for (float& l : logits) sum += (l = std::exp(normal(rng)));
    for (int s = 0; s < k; ++s) {
      b.ids.push_back(experts[s]);
      b.weights.push_back(logits[s] / sum);
    }
    if (t % 7 == 6) b.ids.back() = -1;
  }
  return b;
}

// The layer from the CPU expert math: experts grouped as a backend would, partials summed in
// FP32 in slot order plus the shared partial, output rounded to BF16. Returns [T, H].
std::vector<double> AssembledLayer(const ModelSpec& spec, const WeightSource& source,
                                   const Batch& b) {
  const int H = spec.hidden, k = spec.top_k;
  std::vector<uint16_t> partials(static_cast<size_t>(b.tokens) * (k + 1) * H, 0);
  auto partial = [&](int t, int slot) { return partials.data() + (t * (k + 1) + slot) * H; };
  FfnScratch scratch;
  std::map<int, std::vector<int>> by_expert;  // expert -> flat (t * k + slot) indices
  for (int i = 0; i < b.tokens * k; ++i) {
    if (b.ids[i] >= 0) by_expert[b.ids[i]].push_back(i);
  }
  for (const auto& [expert, slots] : by_expert) {
    const auto w = source.LoadExpert(0, expert);
    EXPECT_TRUE(w.ok());
    std::vector<const uint8_t*> x_rows, s_rows;
    std::vector<float> weights;
    std::vector<uint16_t*> out_rows;
    for (int i : slots) {
      const int t = i / k;
      x_rows.push_back(b.fp8.data() + t * H);
      s_rows.push_back(b.fp8_scales.data() + t * H / 32);
      weights.push_back(b.weights[i]);
      out_rows.push_back(partial(t, i % k));
    }
    RoutedExpertFfn(spec, *w, static_cast<int>(slots.size()), x_rows.data(), s_rows.data(),
                    weights.data(), out_rows.data(), &scratch);
  }
  const auto shared = source.LoadShared(0);
  EXPECT_TRUE(shared.ok());
  std::vector<const uint8_t*> x_rows, s_rows;
  std::vector<uint16_t*> out_rows;
  for (int t = 0; t < b.tokens; ++t) {
    x_rows.push_back(b.fp8.data() + t * H);
    s_rows.push_back(b.fp8_scales.data() + t * H / 32);
    out_rows.push_back(partial(t, k));
  }
  SharedExpertFfn(spec, *shared, b.tokens, x_rows.data(), s_rows.data(), out_rows.data(),
                  &scratch);

  std::vector<double> y(static_cast<size_t>(b.tokens) * H);
  for (int t = 0; t < b.tokens; ++t) {
    for (int j = 0; j < H; ++j) {
      float sum = 0.0f;
      for (int s = 0; s < k; ++s) {
        if (b.ids[t * k + s] >= 0) sum += numerics::BF16ToFloat(partial(t, s)[j]);
      }
      sum += numerics::BF16ToFloat(partial(t, k)[j]);
      y[t * H + j] = numerics::RoundToBF16(sum);
    }
  }
  return y;
}

ReferenceInput InputOf(const Batch& b, bool fp8) {
  ReferenceInput input;
  input.num_tokens = b.tokens;
  input.hidden = fp8 ? nullptr : b.hidden.data();
  input.hidden_fp8 = fp8 ? b.fp8.data() : nullptr;
  input.hidden_scales = fp8 ? b.fp8_scales.data() : nullptr;
  input.topk_ids = b.ids.data();
  input.topk_weights = b.weights.data();
  return input;
}

void CheckLayer(bool fp8_input) {
  const ModelSpec spec = TinyModel("synthetic:2024");
  auto synthetic = WeightSource::Open(spec);
  ASSERT_TRUE(synthetic.ok());
  const testing_util::CachedWeights cached(**synthetic);
  const WeightSource* source = &cached;
  double worst_quantized = 0.0, worst_unquantized = 0.0, worst_cosine = 1.0;
  for (int tokens = 1; tokens <= 64; ++tokens) {
    const Batch b = RandomBatch(spec, tokens, 1000 + tokens);
    const std::vector<double> got = AssembledLayer(spec, *source, b);
    for (double v : got) ASSERT_TRUE(std::isfinite(v));
    const ReferenceInput input = InputOf(b, fp8_input);
    const auto aware = ReferenceLayer(*source, 0, input, ReferenceMode::kQuantizationAware);
    const auto exact = ReferenceLayer(*source, 0, input, ReferenceMode::kUnquantized);
    ASSERT_TRUE(aware.ok() && exact.ok()) << aware.status().ToString();
    const long n = static_cast<long>(got.size());
    const double d_aware = numerics::CalcDiff(got.data(), aware->data(), n);
    const double d_exact = numerics::CalcDiff(got.data(), exact->data(), n);
    const double cosine = numerics::Cosine(got.data(), exact->data(), n);
    EXPECT_LT(d_aware, 1e-4) << "T=" << tokens;
    EXPECT_LT(d_exact, 0.02) << "T=" << tokens;
    EXPECT_GE(cosine, 0.97) << "T=" << tokens;
    worst_quantized = std::max(worst_quantized, d_aware);
    worst_unquantized = std::max(worst_unquantized, d_exact);
    worst_cosine = std::min(worst_cosine, cosine);
  }
  std::printf("worst over T=1..64: calc_diff vs quantization-aware %.3g, vs unquantized %.3g, "
              "cosine %.5f\n", worst_quantized, worst_unquantized, worst_cosine);
}

TEST(Layer, MatchesReferencesFromFloatInput) { CheckLayer(false); }
TEST(Layer, MatchesReferencesFromFp8Input) { CheckLayer(true); }

TEST(Layer, ReferenceSkipsUnusedSlotsAndAddsTheSharedExpert) {
  // Slot order and -1: a token whose slots are (e, -1, -1, -1) must equal the one-slot layer
  // for e plus the shared-only layer, within the reference itself.
  const ModelSpec spec = TinyModel("synthetic:5");
  auto source = WeightSource::Open(spec);
  ASSERT_TRUE(source.ok());
  Batch b = RandomBatch(spec, 1, 77);
  b.ids = {9, -1, -1, -1};
  b.weights = {0.5f, 0.1f, 0.2f, 0.2f};
  const auto one = ReferenceLayer(**source, 0, InputOf(b, true), ReferenceMode::kQuantizationAware);
  b.ids = {-1, -1, -1, -1};
  const auto shared_only =
      ReferenceLayer(**source, 0, InputOf(b, true), ReferenceMode::kQuantizationAware);
  ModelSpec no_shared = spec;
  no_shared.shared_intermediate = 0;
  auto routed_source = WeightSource::Open(no_shared);
  ASSERT_TRUE(routed_source.ok());
  b.ids = {9, -1, -1, -1};
  const auto routed_only =
      ReferenceLayer(**routed_source, 0, InputOf(b, true), ReferenceMode::kQuantizationAware);
  ASSERT_TRUE(one.ok() && shared_only.ok() && routed_only.ok());
  double norm = 0.0;
  for (int j = 0; j < spec.hidden; ++j) {
    EXPECT_EQ((*one)[j], (*shared_only)[j] + (*routed_only)[j]) << j;
    norm += std::fabs((*routed_only)[j]);
  }
  EXPECT_GT(norm, 0.0);
}

TEST(Layer, ReferenceRejectsBadInput) {
  const ModelSpec spec = TinyModel();
  auto source = WeightSource::Open(spec);
  ASSERT_TRUE(source.ok());
  Batch b = RandomBatch(spec, 2, 1);
  b.ids[5] = 16;
  const auto bad_id = ReferenceLayer(**source, 0, InputOf(b, false), ReferenceMode::kUnquantized);
  ASSERT_FALSE(bad_id.ok());
  EXPECT_THAT(bad_id.status().message(), ::testing::HasSubstr("topk_ids[1][1] is 16"));
  const auto bad_layer = ReferenceLayer(**source, 1, InputOf(b, false),
                                        ReferenceMode::kUnquantized);
  EXPECT_THAT(bad_layer.status().message(), ::testing::HasSubstr("layer 1 out of range"));
}

}  // namespace
}  // namespace gcmoe::engine
