// The role2 kernels' in-word UE8M0 decodes (kernels/scale_bytes.h) against engine/numerics, for
// every code at every byte position, with random neighbours in the other three bytes.
#include "kernels/scale_bytes.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "engine/numerics.h"

namespace gcmoe::kernels {
namespace {

uint32_t WordWith(uint8_t code, int b, std::mt19937& rng) {
  const uint32_t others = static_cast<uint32_t>(rng()) & ~(0xFFu << (8 * b));
  return others | (static_cast<uint32_t>(code) << (8 * b));
}

TEST(ScaleBytes, WeightScaleDecodesEveryCodeAtEveryByte) {
  std::mt19937 rng(11);
  for (int b = 0; b < 4; ++b) {
    for (int code = 0; code <= 254; ++code) {
      for (int trial = 0; trial < 8; ++trial) {
        const uint32_t word = WordWith(static_cast<uint8_t>(code), b, rng);
        ASSERT_EQ(std::bit_cast<uint32_t>(WeightScale(word, b)),
                  std::bit_cast<uint32_t>(numerics::DecodeUE8M0(static_cast<uint8_t>(code))))
            << "code " << code << " byte " << b;
      }
    }
  }
}

TEST(ScaleBytes, ActivationScaleDecodesEveryNonzeroCode) {
  std::mt19937 rng(12);
  for (int b = 0; b < 4; ++b) {
    for (int code = 1; code <= 254; ++code) {
      const uint32_t word = WordWith(static_cast<uint8_t>(code), b, rng);
      ASSERT_EQ(ActivationScale(word, b), numerics::DecodeUE8M0(static_cast<uint8_t>(code)))
          << "code " << code << " byte " << b;
    }
  }
  // Code 0 is the one it gets wrong; the quantizers never write it (their floor, below).
  EXPECT_EQ(ActivationScale(0u, 0), 0.0f);
  EXPECT_GT(numerics::BlockScaleCode(0.0f, numerics::kE4M3Max), 0);
}

// The division-free E4M3 block scale code against engine/numerics' division: every exponent
// an amax can have, the mantissas around 1.75 (where the ceiling steps) and random ones, the
// floor, Inf and NaN.
TEST(ScaleBytes, E4m3BlockScaleCodeMatchesTheDivision) {
  std::mt19937 rng(13);
  const auto check = [](uint32_t bits) {
    const float amax = std::bit_cast<float>(bits);
    ASSERT_EQ(E4m3BlockScaleCode(amax), numerics::BlockScaleCode(amax, numerics::kE4M3Max))
        << std::hex << "amax bits 0x" << bits;
  };
  for (uint32_t exponent = 0; exponent <= 254; ++exponent) {
    for (int32_t d = -64; d <= 64; ++d) check(exponent << 23 | static_cast<uint32_t>(0x600000 + d));
    for (uint32_t m : {0u, 1u, 0x400000u, 0x7FFFFFu}) check(exponent << 23 | m);
    for (int trial = 0; trial < 256; ++trial) {
      check(exponent << 23 | (static_cast<uint32_t>(rng()) & 0x7FFFFFu));
    }
  }
  for (uint32_t special : {0x7F800000u, 0x7FC00000u, 0x80000000u, 0xBF800000u}) check(special);
  EXPECT_EQ(E4m3BlockScaleCode(448.0f), 127u);
  EXPECT_EQ(E4m3BlockScaleCode(std::nextafter(448.0f, 1e38f)), 128u);
}

}  // namespace
}  // namespace gcmoe::kernels
