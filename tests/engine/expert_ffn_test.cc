// The CPU expert math against hand-computed values and the quantization-aware float64
// reference, and the row-independence invariant of expert_ffn.h.
#include "engine/expert_ffn.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "engine/ffn_dot.h"
#include "engine/numerics.h"
#include "engine/reference_layer.h"
#include "tests/engine/tiny_model.h"

namespace gcmoe::engine {
namespace {

using testing_util::TinyModel;

// `rows` activation rows quantized to E4M3 K32 (DESIGN.md §4 step 1), with pointers per row.
struct Activations {
  Activations(int rows, int hidden, uint32_t seed) : hidden(hidden) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(rows) * hidden);
    for (float& v : x) v = normal(rng);
    codes.resize(x.size());
    scales.resize(x.size() / 32);
    for (int r = 0; r < rows; ++r) {
      numerics::QuantizeE4M3K32(x.data() + r * hidden, hidden, codes.data() + r * hidden,
                                scales.data() + r * hidden / 32);
    }
    std::uniform_real_distribution<float> weight(0.05f, 1.0f);
    for (int r = 0; r < rows; ++r) route_weights.push_back(weight(rng));
  }
  const uint8_t* row(int r) const { return codes.data() + r * hidden; }
  const uint8_t* scale_row(int r) const { return scales.data() + r * hidden / 32; }

  int hidden;
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scales;
  std::vector<float> route_weights;
};

// Runs the routed (expert >= 0) or shared expert on the listed rows of `x`; returns [n, H] BF16.
std::vector<uint16_t> Run(const ModelSpec& spec, const WeightSource& source, int expert,
                          const Activations& x, const std::vector<int>& rows,
                          FfnScratch* scratch) {
  std::vector<uint16_t> out(rows.size() * spec.hidden);
  std::vector<const uint8_t*> x_rows, s_rows;
  std::vector<float> weights;
  std::vector<uint16_t*> out_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    x_rows.push_back(x.row(rows[i]));
    s_rows.push_back(x.scale_row(rows[i]));
    weights.push_back(x.route_weights[rows[i]]);
    out_rows.push_back(out.data() + i * spec.hidden);
  }
  const int n = static_cast<int>(rows.size());
  if (expert >= 0) {
    const auto w = source.LoadExpert(0, expert);
    EXPECT_TRUE(w.ok());
    RoutedExpertFfn(spec, *w, n, x_rows.data(), s_rows.data(), weights.data(), out_rows.data(),
                    scratch);
  } else {
    const auto w = source.LoadShared(0);
    EXPECT_TRUE(w.ok());
    SharedExpertFfn(spec, *w, n, x_rows.data(), s_rows.data(), out_rows.data(), scratch);
  }
  return out;
}

TEST(ExpertFfn, HandComputedSwiGluClampAndRoutingWeight) {
  // H = I = 32, all weights 1.0 (E2M1 code 2, scale 2^0), x̂ all 0.5 (E4M3 0x30, scale 2^0).
  // a = 32 * 0.5 = 16 for gate and up.
  ModelSpec spec = TinyModel();
  spec.hidden = 32;
  spec.intermediate = 32;
  ExpertWeights w;
  w.w1.assign(64 * 16, 0x22);
  w.w1_scales.assign(64, 127);
  w.w2.assign(32 * 16, 0x22);
  w.w2_scales.assign(32, 127);
  std::vector<uint8_t> x(32, 0x30);
  uint8_t x_scale = 127;
  const uint8_t* x_rows[1] = {x.data()};
  const uint8_t* s_rows[1] = {&x_scale};
  const float route_weight = 0.75f;
  std::vector<uint16_t> out(32);
  uint16_t* out_rows[1] = {out.data()};
  FfnScratch scratch;

  // Clamp 10: g' = u' = 10, h = 10 sigmoid(10) 10 0.75 = 74.9966; its block scale is 2^-2 and
  // 299.986 rounds to the E4M3 value 288 (the grid is 32 apart there): ĥ = 72, p = 32 * 72.
  RoutedExpertFfn(spec, w, 1, x_rows, s_rows, &route_weight, out_rows, &scratch);
  for (uint16_t v : out) ASSERT_EQ(numerics::BF16ToFloat(v), 2304.0f);

  // No clamp: h = 16 sigmoid(16) 16 0.75 = 191.99998, scale 2^-1, 383.99996 -> 384: ĥ = 192.
  spec.activation_clamp.reset();
  RoutedExpertFfn(spec, w, 1, x_rows, s_rows, &route_weight, out_rows, &scratch);
  for (uint16_t v : out) ASSERT_EQ(numerics::BF16ToFloat(v), 6144.0f);

  // The clamp also bounds `up` from below: up = -16 -> -10 (gate stays 10). Negate W1's up half.
  spec.activation_clamp = 10.0f;
  std::fill(w.w1.begin() + 32 * 16, w.w1.end(), 0xAA);  // -1.0 in both nibbles
  RoutedExpertFfn(spec, w, 1, x_rows, s_rows, &route_weight, out_rows, &scratch);
  for (uint16_t v : out) ASSERT_EQ(numerics::BF16ToFloat(v), -2304.0f);
}

// The quantization-aware reference of one expert: a layer whose only slot is that expert.
std::vector<double> ReferencePartials(const ModelSpec& spec, int expert, const Activations& x,
                                      int rows) {
  ModelSpec one_slot = spec;
  one_slot.top_k = 1;
  if (expert >= 0) one_slot.shared_intermediate = 0;
  auto source = WeightSource::Open(one_slot);
  EXPECT_TRUE(source.ok());
  std::vector<int32_t> ids(rows, expert >= 0 ? expert : -1);
  ReferenceInput input;
  input.num_tokens = rows;
  input.hidden_fp8 = x.codes.data();
  input.hidden_scales = x.scales.data();
  input.topk_ids = ids.data();
  input.topk_weights = x.route_weights.data();
  auto y = ReferenceLayer(**source, 0, input, ReferenceMode::kQuantizationAware);
  EXPECT_TRUE(y.ok()) << y.status().ToString();
  return y.ok() ? *y : std::vector<double>();
}

void ExpectRowsMatchReference(const ModelSpec& spec, int expert) {
  const int rows = 64;
  const Activations x(rows, spec.hidden, 100 + expert);
  auto source = WeightSource::Open(spec);
  ASSERT_TRUE(source.ok());
  std::vector<int> all(rows);
  for (int r = 0; r < rows; ++r) all[r] = r;
  FfnScratch scratch;
  const std::vector<uint16_t> out = Run(spec, **source, expert, x, all, &scratch);
  const std::vector<double> want = ReferencePartials(spec, expert, x, rows);
  ASSERT_EQ(want.size(), out.size());
  const int H = spec.hidden;
  double worst = 0.0;
  for (int r = 0; r < rows; ++r) {
    std::vector<double> got(H);
    for (int j = 0; j < H; ++j) {
      got[j] = numerics::BF16ToFloat(out[r * H + j]);
      ASSERT_TRUE(std::isfinite(got[j]));
    }
    const double diff = numerics::CalcDiff(got.data(), want.data() + r * H, H);
    worst = std::max(worst, diff);
    EXPECT_LT(diff, 1e-4) << "row " << r;
  }
  ::testing::Test::RecordProperty("worst_calc_diff", std::to_string(worst));
}

TEST(ExpertFfn, RoutedMatchesQuantizationAwareReference) {
  ExpectRowsMatchReference(TinyModel(), 3);
  ModelSpec no_clamp = TinyModel("synthetic:9");
  no_clamp.activation_clamp.reset();
  no_clamp.activation_alpha = 1.702f;
  ExpectRowsMatchReference(no_clamp, 12);
}

TEST(ExpertFfn, SharedMatchesQuantizationAwareReference) {
  ExpectRowsMatchReference(TinyModel(), -1);
}

// expert_ffn.h's invariant: a row's output depends on that row only.
void ExpectRowsIndependent(int expert) {
  const ModelSpec spec = TinyModel();
  auto source = WeightSource::Open(spec);
  ASSERT_TRUE(source.ok());
  const Activations x(64, spec.hidden, 7);
  const int H = spec.hidden;
  FfnScratch scratch;
  std::vector<int> all(64);
  for (int r = 0; r < 64; ++r) all[r] = 63 - r;  // reversed order, so positions differ too
  const std::vector<uint16_t> batch = Run(spec, **source, expert, x, all, &scratch);
  for (int r : {0, 1, 17, 63}) {
    const std::vector<uint16_t> alone = Run(spec, **source, expert, x, {r}, &scratch);
    const std::vector<uint16_t> with_one = Run(spec, **source, expert, x, {(r + 5) % 64, r},
                                               &scratch);
    FfnScratch fresh;
    const std::vector<uint16_t> alone_fresh = Run(spec, **source, expert, x, {r}, &fresh);
    const uint16_t* in_batch = batch.data() + (63 - r) * H;
    EXPECT_EQ(std::memcmp(alone.data(), in_batch, H * 2), 0) << "row " << r;
    EXPECT_EQ(std::memcmp(with_one.data() + H, in_batch, H * 2), 0) << "row " << r;
    EXPECT_EQ(std::memcmp(alone_fresh.data(), in_batch, H * 2), 0) << "row " << r;
  }
}

TEST(ExpertFfn, RoutedRowsAreIndependent) { ExpectRowsIndependent(5); }
TEST(ExpertFfn, SharedRowsAreIndependent) { ExpectRowsIndependent(-1); }

TEST(ExpertFfn, ZeroRowsIsANoOp) {
  const ModelSpec spec = TinyModel();
  auto source = WeightSource::Open(spec);
  ASSERT_TRUE(source.ok());
  const auto w = (*source)->LoadExpert(0, 0);
  FfnScratch scratch;
  RoutedExpertFfn(spec, *w, 0, nullptr, nullptr, nullptr, nullptr, &scratch);
  EXPECT_TRUE(scratch.act.empty());
}

// The documented order, written out in scalar code: 16 lane sums in increasing k, then the
// tree l += l + 8, l += l + 4, l += l + 2, l += l + 1. (This file builds without contraction.)
float DotInDocumentedOrder(const float* w, const float* x, int n) {
  float lanes[16] = {};
  for (int k = 0; k < n; ++k) lanes[k % 16] += w[k] * x[k];
  for (int width = 8; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

TEST(FfnDot, EveryImplementationFollowsTheDocumentedOrder) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int n : {16, 32, 128, 256, 2048}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> w0(n), w1(n), x(n);
      for (int k = 0; k < n; ++k) {
        // Wide dynamic range, so a different order would show in the low bits.
        w0[k] = std::ldexp(normal(rng), static_cast<int>(rng() % 24) - 12);
        w1[k] = normal(rng);
        x[k] = std::ldexp(normal(rng), static_cast<int>(rng() % 24) - 12);
      }
      const float want0 = DotInDocumentedOrder(w0.data(), x.data(), n);
      const float want1 = DotInDocumentedOrder(w1.data(), x.data(), n);
      float got0, got1;
      ffn::Dot2(w0.data(), w1.data(), x.data(), n, &got0, &got1);
      ASSERT_EQ(got0, want0) << "n=" << n;
      ASSERT_EQ(got1, want1) << "n=" << n;
      ASSERT_EQ(ffn::Dot1(w0.data(), x.data(), n), want0) << "n=" << n;
      ffn::Dot2Portable(w0.data(), w1.data(), x.data(), n, &got0, &got1);
      ASSERT_EQ(got0, want0) << "n=" << n;
      ASSERT_EQ(got1, want1) << "n=" << n;
      if (ffn::HasWideDot()) {
        ffn::Dot2Wide(w0.data(), w1.data(), x.data(), n, &got0, &got1);
        ASSERT_EQ(got0, want0) << "n=" << n;
        ASSERT_EQ(got1, want1) << "n=" << n;
      }
    }
  }
}

}  // namespace
}  // namespace gcmoe::engine
