// Formats of DESIGN.md §4 against values computed here from the bit fields (std::ldexp), and
// rounding checked at every midpoint between adjacent codes.
#include "engine/numerics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace gcmoe::numerics {
namespace {

// OCP E4M3 (e4m3fn) from its fields: bias 7, subnormals m * 2^-9, S.1111.111 NaN.
double E4M3FromFields(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -magnitude : magnitude;
}

// OCP E2M1 from its fields: bias 1, subnormal m * 0.5.
double E2M1FromFields(int code) {
  const int s = code >> 3, e = (code >> 1) & 3, m = code & 1;
  const double magnitude = e == 0 ? 0.5 * m : std::ldexp(1.0 + m / 2.0, e - 1);
  return s ? -magnitude : magnitude;
}

float BitsToFloat(uint32_t bits) { return std::bit_cast<float>(bits); }

// Reference encoder by search: nearest of the non-negative codes 0..max_code (whose values
// increase with the code), ties to the even code, saturating above the largest value.
template <typename Decode>
int NearestCode(double value, int max_code, int sign_bit, Decode decode) {
  if (std::isnan(value)) return -1;
  const int sign = std::signbit(value) ? sign_bit : 0;
  const double a = std::fabs(value);
  if (a >= decode(max_code)) return sign | max_code;
  int lo = 0;
  while (lo + 1 <= max_code && decode(lo + 1) <= a) ++lo;
  const double below = a - decode(lo), above = decode(lo + 1) - a;
  int code = lo;
  if (above < below || (above == below && (lo & 1))) code = lo + 1;
  return sign | code;
}

TEST(E4M3, AllCodesDecodeToOcpValues) {
  for (int code = 0; code < 256; ++code) {
    const double expected = E4M3FromFields(code);
    const float got = DecodeE4M3(static_cast<uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << code;
    } else {
      EXPECT_EQ(static_cast<double>(got), expected) << "code " << code;
      EXPECT_EQ(std::signbit(got), code >= 128) << "code " << code;
    }
  }
  EXPECT_EQ(DecodeE4M3(0x7E), 448.0f);
  EXPECT_EQ(DecodeE4M3(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(DecodeE4M3(0x08), std::ldexp(1.0f, -6));
}

TEST(E4M3, EveryCodeEncodesToItself) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;  // NaN codes
    EXPECT_EQ(EncodeE4M3(DecodeE4M3(static_cast<uint8_t>(code))), code) << "code " << code;
  }
}

TEST(E4M3, MidpointsRoundToNearestEven) {
  for (int sign : {0, 0x80}) {
    for (int lo = 0; lo < 0x7E; ++lo) {
      const double a = std::fabs(E4M3FromFields(lo)), b = std::fabs(E4M3FromFields(lo + 1));
      const float mid = static_cast<float>((a + b) / 2);
      ASSERT_EQ(static_cast<double>(mid), (a + b) / 2) << "midpoint not exact";
      const float signed_mid = sign ? -mid : mid;
      const int even = (lo & 1) ? lo + 1 : lo;
      EXPECT_EQ(EncodeE4M3(signed_mid), sign | even) << "midpoint of " << lo;
      EXPECT_EQ(EncodeE4M3(std::nextafter(signed_mid, 0.0f)), sign | lo) << "below " << lo;
      EXPECT_EQ(EncodeE4M3(std::nextafter(signed_mid, sign ? -1e9f : 1e9f)), sign | (lo + 1))
          << "above " << lo;
    }
  }
}

TEST(E4M3, SaturatesAndKeepsSignAndNaN) {
  EXPECT_EQ(EncodeE4M3(448.0f), 0x7E);
  EXPECT_EQ(EncodeE4M3(463.99f), 0x7E);
  EXPECT_EQ(EncodeE4M3(464.0f), 0x7E);  // the midpoint to 480 would round up: saturates
  EXPECT_EQ(EncodeE4M3(1e30f), 0x7E);
  EXPECT_EQ(EncodeE4M3(-1e30f), 0xFE);
  EXPECT_EQ(EncodeE4M3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(EncodeE4M3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(EncodeE4M3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(EncodeE4M3(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(EncodeE4M3(0.0f), 0x00);
  EXPECT_EQ(EncodeE4M3(-0.0f), 0x80);
  EXPECT_EQ(EncodeE4M3(std::ldexp(1.0f, -10)), 0x00);   // tie between 0 and 2^-9: even
  EXPECT_EQ(EncodeE4M3(-std::ldexp(1.0f, -10)), 0x80);  // rounds to -0
  EXPECT_EQ(EncodeE4M3(std::ldexp(3.0f, -10)), 0x02);   // tie between codes 1 and 2: even
  EXPECT_EQ(EncodeE4M3(FLT_TRUE_MIN), 0x00);
  EXPECT_EQ(EncodeE4M3(-FLT_TRUE_MIN), 0x80);
}

TEST(E4M3, MatchesSearchEncoderOnSampledFloats) {
  // Every 9973rd bit pattern (all exponents, both signs) plus dense coverage of [-500, 500].
  auto check = [](float f) {
    const int expected = NearestCode(f, 0x7E, 0x80, [](int c) { return E4M3FromFields(c); });
    if (expected < 0) return;
    ASSERT_EQ(EncodeE4M3(f), expected) << "value " << f;
  };
  for (uint64_t bits = 0; bits < (1ull << 32); bits += 9973) {
    check(BitsToFloat(static_cast<uint32_t>(bits)));
  }
  for (float f = -500.0f; f <= 500.0f; f += 0.0371f) check(f);
}

TEST(E2M1, AllCodesDecodeToOcpValues) {
  const float expected_magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int code = 0; code < 16; ++code) {
    EXPECT_EQ(static_cast<double>(DecodeE2M1(static_cast<uint8_t>(code))), E2M1FromFields(code));
    EXPECT_EQ(std::fabs(DecodeE2M1(static_cast<uint8_t>(code))), expected_magnitudes[code & 7]);
    EXPECT_EQ(std::signbit(DecodeE2M1(static_cast<uint8_t>(code))), code >= 8);
  }
  EXPECT_EQ(DecodeE2M1(0xF3), DecodeE2M1(0x3));  // only the low nibble counts
}

TEST(E2M1, MidpointsRoundToNearestEvenAndSaturate) {
  for (int sign : {0, 8}) {
    for (int lo = 0; lo < 7; ++lo) {
      const float a = std::fabs(static_cast<float>(E2M1FromFields(lo)));
      const float b = std::fabs(static_cast<float>(E2M1FromFields(lo + 1)));
      const float mid = sign ? -(a + b) / 2 : (a + b) / 2;
      const int even = (lo & 1) ? lo + 1 : lo;
      EXPECT_EQ(EncodeE2M1(mid), sign | even) << "midpoint of " << lo;
      EXPECT_EQ(EncodeE2M1(std::nextafter(mid, 0.0f)), sign | lo);
      EXPECT_EQ(EncodeE2M1(std::nextafter(mid, sign ? -100.0f : 100.0f)), sign | (lo + 1));
      EXPECT_EQ(EncodeE2M1(sign ? -a : a), sign | lo);
    }
  }
  EXPECT_EQ(EncodeE2M1(6.0f), 0x7);
  EXPECT_EQ(EncodeE2M1(7.0f), 0x7);  // the midpoint to 8 would round up: saturates
  EXPECT_EQ(EncodeE2M1(1e9f), 0x7);
  EXPECT_EQ(EncodeE2M1(-1e9f), 0xF);
  EXPECT_EQ(EncodeE2M1(std::numeric_limits<float>::infinity()), 0x7);
  EXPECT_EQ(EncodeE2M1(-std::numeric_limits<float>::infinity()), 0xF);
  EXPECT_EQ(EncodeE2M1(std::numeric_limits<float>::quiet_NaN()), 0x7);
  EXPECT_EQ(EncodeE2M1(-std::numeric_limits<float>::quiet_NaN()), 0xF);
  EXPECT_EQ(EncodeE2M1(-0.0f), 0x8);
  EXPECT_EQ(EncodeE2M1(0.25f), 0x0);  // tie between 0 and 0.5: even
}

TEST(E2M1, MatchesSearchEncoder) {
  for (float f = -8.0f; f <= 8.0f; f += 1.0f / 1024) {
    const int expected = NearestCode(f, 7, 8, [](int c) { return E2M1FromFields(c); });
    ASSERT_EQ(EncodeE2M1(f), expected) << "value " << f;
  }
}

TEST(UE8M0, AllCodes) {
  for (int code = 0; code < 255; ++code) {
    EXPECT_EQ(static_cast<double>(DecodeUE8M0(static_cast<uint8_t>(code))),
              std::ldexp(1.0, code - 127))
        << "code " << code;
  }
  EXPECT_TRUE(std::isnan(DecodeUE8M0(255)));
}

// Correct BF16 rounding computed in double: the nearer of the two neighbours, ties to even.
uint16_t BF16ByComparison(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t down = static_cast<uint16_t>(bits >> 16);
  const uint16_t up = static_cast<uint16_t>(down + 1);
  const double lo = std::bit_cast<float>(static_cast<uint32_t>(down) << 16);
  const double hi = std::bit_cast<float>(static_cast<uint32_t>(up) << 16);
  const double d_lo = std::fabs(static_cast<double>(f) - lo);
  // The value above the largest finite BF16 is +-Inf; measure against 2^128 instead.
  const double d_hi = std::isinf(hi) ? std::fabs(std::ldexp(1.0, 128) - std::fabs(f))
                                     : std::fabs(hi - static_cast<double>(f));
  if (d_lo < d_hi || (d_lo == d_hi && (down & 1) == 0)) return down;
  return up;
}

TEST(BF16, RoundsToNearestEvenAtTies) {
  for (uint32_t upper : {0x3F80u, 0x3F81u, 0xBF80u, 0xBF81u, 0x3F7Fu, 0x0001u, 0x7F7Eu, 0x7F7Fu,
                         0x4049u, 0xC049u, 0x0000u, 0x8000u}) {
    for (uint32_t lower : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const float f = BitsToFloat((upper << 16) | lower);
      EXPECT_EQ(FloatToBF16(f), BF16ByComparison(f)) << std::hex << upper << lower;
    }
  }
  EXPECT_EQ(FloatToBF16(BitsToFloat(0x3F808000u)), 0x3F80);  // tie, even below
  EXPECT_EQ(FloatToBF16(BitsToFloat(0x3F818000u)), 0x3F82);  // tie, even above
  EXPECT_EQ(FloatToBF16(BitsToFloat(0x3F7F8000u)), 0x3F80);  // carry into the exponent
  EXPECT_EQ(FloatToBF16(BitsToFloat(0x7F7F8000u)), 0x7F80);  // overflow to Inf
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::infinity()), 0x7F80);
  const uint16_t nan = FloatToBF16(BitsToFloat(0x7F800001u));  // payload only in low bits
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x7F, 0);
  EXPECT_EQ(RoundToBF16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  EXPECT_EQ(BF16ToFloat(0xC000), -2.0f);
}

TEST(BF16, MatchesComparisonOnSampledFloats) {
  for (uint64_t bits = 0; bits < (1ull << 32); bits += 7919) {
    const float f = BitsToFloat(static_cast<uint32_t>(bits));
    if (!std::isfinite(f)) continue;
    ASSERT_EQ(FloatToBF16(f), BF16ByComparison(f)) << std::hex << bits;
  }
}

TEST(FP16, AllCodesDecode) {
  for (int code = 0; code < 65536; ++code) {
    const int s = code >> 15, e = (code >> 10) & 31, m = code & 1023;
    const float got = FP16ToFloat(static_cast<uint16_t>(code));
    if (e == 31) {
      EXPECT_TRUE(m ? std::isnan(got) : std::isinf(got)) << code;
      continue;
    }
    const double magnitude = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
    ASSERT_EQ(static_cast<double>(got), s ? -magnitude : magnitude) << code;
    ASSERT_EQ(std::signbit(got), s == 1) << code;
  }
}

// ceil(log2(r)) for r > 0 via frexp: r = f * 2^e with f in [0.5, 1).
int CeilLog2(double r) {
  int e = 0;
  const double f = std::frexp(r, &e);
  return f == 0.5 ? e - 1 : e;
}

int ExpectedScaleCode(float amax, float fmt_max) {
  const float ratio = std::max(amax, 1e-4f) / fmt_max;
  if (std::isinf(ratio)) return 254;
  return std::clamp(CeilLog2(ratio), -127, 127) + 127;
}

TEST(BlockScale, EdgeCases) {
  // amax 0 (and anything below 1e-4) takes the 1e-4 floor: 1e-4 / 448 = 2^-22.09.
  EXPECT_EQ(BlockScaleCode(0.0f, kE4M3Max), 127 - 22);
  EXPECT_EQ(BlockScaleCode(5e-5f, kE4M3Max), 127 - 22);
  EXPECT_EQ(BlockScaleCode(std::numeric_limits<float>::quiet_NaN(), kE4M3Max), 127 - 22);
  EXPECT_EQ(BlockScaleCode(0.0f, kE2M1Max), 127 - 15);  // 1e-4 / 6 = 2^-15.9
  // Exact powers of two times fmt_max: exactly that power; one ulp above: the next one.
  for (int k = -20; k <= 100; ++k) {
    const float amax = std::ldexp(kE4M3Max, k);
    EXPECT_EQ(BlockScaleCode(amax, kE4M3Max), 127 + k) << k;
    EXPECT_EQ(BlockScaleCode(std::nextafter(amax, 1e38f), kE4M3Max), 128 + k) << k;
    EXPECT_EQ(BlockScaleCode(std::nextafter(amax, 0.0f), kE4M3Max), 127 + k) << k;
    const float amax4 = std::ldexp(kE2M1Max, k);
    if (amax4 < 1e-4f) continue;  // below the floor (k < -15)
    EXPECT_EQ(BlockScaleCode(amax4, kE2M1Max), 127 + k) << k;
    EXPECT_EQ(BlockScaleCode(std::nextafter(amax4, 1e38f), kE2M1Max), 128 + k) << k;
  }
  // Clamps: ratio Inf or above 2^127 -> 127; ratio at most 2^-127 -> -127.
  EXPECT_EQ(BlockScaleCode(std::numeric_limits<float>::infinity(), kE4M3Max), 254);
  EXPECT_EQ(BlockScaleCode(FLT_MAX, 1.0f), 254);
  EXPECT_EQ(BlockScaleCode(FLT_MAX, 0.5f), 254);          // ratio overflows to Inf
  EXPECT_EQ(BlockScaleCode(0.0f, 1e36f), 0);              // ratio 1e-40, a float subnormal
  EXPECT_EQ(BlockScaleCode(1e-4f, 1e-4f * 0x1p127f), 0);  // ratio exactly 2^-127
  EXPECT_EQ(BlockScaleCode(1.5e-4f, 1e-4f * 0x1p127f), 1);  // 1.5 * 2^-127: ceil -> -126
}

TEST(BlockScale, MatchesFrexpOnSampledValues) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> log_amax(-30.0f, 40.0f);
  for (int i = 0; i < 200000; ++i) {
    const float amax = std::exp2(log_amax(rng));
    for (float fmt_max : {kE4M3Max, kE2M1Max}) {
      ASSERT_EQ(BlockScaleCode(amax, fmt_max), ExpectedScaleCode(amax, fmt_max)) << amax;
    }
  }
}

TEST(BlockQuant, E4M3RoundTripFollowsTheSpec) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(32 * 8);
  for (float& v : x) v = normal(rng);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block
  x[100] = 448.0f * 4;                              // an exact power-of-two multiple
  std::vector<uint8_t> q(x.size()), s(x.size() / 32);
  QuantizeE4M3K32(x.data(), static_cast<int>(x.size()), q.data(), s.data());
  std::vector<float> back(x.size());
  DequantizeE4M3K32(q.data(), s.data(), static_cast<int>(x.size()), back.data());
  for (size_t b = 0; b < s.size(); ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    ASSERT_EQ(s[b], ExpectedScaleCode(amax, kE4M3Max));
    const double scale = std::ldexp(1.0, s[b] - 127);
    for (int i = 0; i < 32; ++i) {
      const size_t j = b * 32 + i;
      const int code = NearestCode(x[j] / scale, 0x7E, 0x80,
                                   [](int c) { return E4M3FromFields(c); });
      ASSERT_EQ(q[j], code) << j;
      ASSERT_EQ(static_cast<double>(back[j]), E4M3FromFields(code) * scale) << j;
    }
  }
  EXPECT_EQ(s[2], 127 - 22);
  EXPECT_EQ(s[3], 127 + 2);  // 1792 = 448 * 4
  EXPECT_EQ(back[100], 1792.0f);
}

TEST(BlockQuant, E2M1PacksElement2iInTheLowNibble) {
  std::vector<float> x(32, 0.0f);
  x[0] = 6.0f;    // code 0x7, sets the block scale to 2^0
  x[1] = -0.5f;   // code 0x9
  x[2] = 1.5f;    // code 0x3
  x[3] = -4.0f;   // code 0xE
  x[31] = 2.9f;   // rounds to 3: code 0x5
  uint8_t packed[16], scale;
  QuantizeE2M1K32(x.data(), 32, packed, &scale);
  EXPECT_EQ(scale, 127);
  EXPECT_EQ(packed[0], 0x97);
  EXPECT_EQ(packed[1], 0xE3);
  EXPECT_EQ(packed[15], 0x50);
  float back[32];
  DequantizeE2M1K32(packed, &scale, 32, back);
  EXPECT_EQ(back[1], -0.5f);
  EXPECT_EQ(back[3], -4.0f);
  EXPECT_EQ(back[31], 3.0f);

  // With a larger amax the scale grows and every value divides by it first.
  x[0] = 24.0f;  // 24 / 6 = 4 = 2^2
  QuantizeE2M1K32(x.data(), 32, packed, &scale);
  EXPECT_EQ(scale, 129);
  DequantizeE2M1K32(packed, &scale, 32, back);
  EXPECT_EQ(back[0], 24.0f);
  EXPECT_EQ(back[1], -0.0f);  // -0.5 / 4 = -0.125 -> -0
  EXPECT_EQ(back[2], 2.0f);   // 1.5 / 4 = 0.375 -> 0.5 (nearest)
  EXPECT_EQ(back[3], -4.0f);
}

TEST(Metrics, CalcDiffAndCosine) {
  const double x[2] = {1.0, 2.0};
  const double y[2] = {1.0, 2.5};
  const double neg[2] = {-1.0, -2.0};
  const double zero[2] = {0.0, 0.0};
  const double ortho[2] = {-2.0, 1.0};
  EXPECT_DOUBLE_EQ(CalcDiff(x, x, 2), 0.0);
  EXPECT_DOUBLE_EQ(CalcDiff(x, y, 2), 1.0 - 12.0 / 12.25);
  EXPECT_DOUBLE_EQ(CalcDiff(x, neg, 2), 2.0);
  EXPECT_DOUBLE_EQ(CalcDiff(x, zero, 2), 1.0);
  EXPECT_DOUBLE_EQ(CalcDiff(zero, zero, 2), 0.0);
  EXPECT_DOUBLE_EQ(Cosine(x, y, 2), 6.0 / std::sqrt(5.0 * 7.25));
  EXPECT_DOUBLE_EQ(Cosine(x, neg, 2), -1.0);
  EXPECT_DOUBLE_EQ(Cosine(x, ortho, 2), 0.0);
  EXPECT_DOUBLE_EQ(Cosine(x, zero, 2), 0.0);
}

}  // namespace
}  // namespace gcmoe::numerics
