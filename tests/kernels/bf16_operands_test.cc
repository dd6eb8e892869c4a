// The bf16 role2's operand arithmetic (kernels/bf16_operands.h) against engine/numerics: the
// E4M3 pair decode for every code in both slots of both pairs, the scale multipliers for every
// code they accept, and the whole chain decoded code x multiplier(s) = the value numerics gives,
// exactly. On the host MulBf16x2 rounds a float product to nearest even; every product checked
// here is exact, so any correct multiply agrees (the GPU tests run the device's).
#include "kernels/bf16_operands.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "engine/numerics.h"
#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::kernels {
namespace {

// Half h (0 low, 1 high) of a BF16x2 register.
float Half(uint32_t reg, int h) {
  return numerics::BF16ToFloat(static_cast<uint16_t>(reg >> (16 * h)));
}

bool IsE4m3Nan(uint32_t code) { return (code & 0x7Fu) == 0x7Fu; }

TEST(Bf16Operands, E4m3PairDecodesEveryCodeInEverySlot) {
  std::mt19937 rng(21);
  for (int j = 0; j < 2; ++j) {
    for (int h = 0; h < 2; ++h) {
      const int byte = 2 * j + h;
      for (uint32_t code = 0; code < 256; ++code) {
        if (IsE4m3Nan(code)) continue;
        const uint32_t word =
            (static_cast<uint32_t>(rng()) & ~(0xFFu << (8 * byte))) | (code << (8 * byte));
        const float got = Half(E4m3PairToBf16(word, j), h) * kE4m3Bf16DecodeScale;
        const float want = numerics::DecodeE4M3(static_cast<uint8_t>(code));
        ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
            << "code " << code << " pair " << j << " half " << h;
      }
    }
  }
}

// Every in-range code in every byte of a scale word, the other three bytes random in-range
// codes or all at the largest (the most a lower byte can carry), as the kernel biases them.
TEST(Bf16Operands, ScaleRowPairIsTwoToTheCodePlusBias) {
  std::mt19937 rng(22);
  for (const uint32_t bias : {kE2m1Bf16ScaleBias, kE4m3Bf16ScaleBias}) {
    const int max_code = MaxBf16ScaleCode(bias);
    std::uniform_int_distribution<uint32_t> any(0, static_cast<uint32_t>(max_code));
    for (int b = 0; b < 4; ++b) {
      for (int code = 0; code <= max_code; ++code) {
        for (const bool others_max : {false, true}) {
          uint32_t word = 0;
          for (int o = 0; o < 4; ++o) {
            const uint32_t c = o == b       ? static_cast<uint32_t>(code)
                               : others_max ? static_cast<uint32_t>(max_code)
                                            : any(rng);
            word |= c << (8 * o);
          }
          // Byte b is half b % 2 of the row pair of bytes b & ~1, b | 1.
          const uint32_t rows = BiasedScaleRowPair(BiasScaleBytes(word, bias), b / 2);
          const float want = std::ldexp(1.0f, code + static_cast<int>(bias) - 127);
          ASSERT_EQ(Half(rows, b % 2), want)
              << std::hex << "word " << word << std::dec << " byte " << b << " bias " << bias;
          // Multiplying by that half multiplies both halves of a register by it.
          const uint32_t product = MulBf16x2ByHalf(0x3FC03F80u, rows, b % 2);  // 1.5, 1.0
          ASSERT_EQ(Half(product, 0), want);
          ASSERT_EQ(Half(product, 1), 1.5f * want);
        }
      }
    }
  }
}

// A weight: the lane-word decode times its scale multiplier is E2M1 value x 2^(code - 127), for
// every code and every scale the bf16 kernel accepts (code 0 gives BF16 subnormals).
TEST(Bf16Operands, E2m1WeightTimesScaleIsExact) {
  for (uint32_t code = 0; code < 16; ++code) {
    const uint8_t lo[4] = {static_cast<uint8_t>(code), static_cast<uint8_t>(15 - code), 0, 9};
    const uint8_t hi[4] = {3, 7, static_cast<uint8_t>(code), 12};
    const uint32_t reg = DecodeE2m1Bf16Word(PlaceE2m1Bf16Word(lo, hi)).r[0];
    for (int scale = 0; scale <= MaxBf16ScaleCode(kE2m1Bf16ScaleBias); ++scale) {
      const uint32_t product = MulBf16x2ByHalf(
          reg,
          BiasedScaleRowPair(BiasScaleBytes(static_cast<uint32_t>(scale), kE2m1Bf16ScaleBias), 0),
          0);
      const double unit = numerics::DecodeUE8M0(static_cast<uint8_t>(scale));
      ASSERT_EQ(Half(product, 0), numerics::DecodeE2M1(lo[0]) * unit) << code << " " << scale;
      ASSERT_EQ(Half(product, 1), numerics::DecodeE2M1(lo[1]) * unit) << code << " " << scale;
    }
  }
}

// The shared expert's E4M3 weights the same way, scales up to 2^7.
TEST(Bf16Operands, E4m3WeightTimesScaleIsExact) {
  for (uint32_t code = 0; code < 256; ++code) {
    if (IsE4m3Nan(code)) continue;
    const uint32_t reg = E4m3PairToBf16(code | (0x38u << 8), 0);  // 0x38: 1.0 in the high half
    for (int scale = 0; scale <= MaxBf16ScaleCode(kE4m3Bf16ScaleBias); ++scale) {
      const uint32_t product = MulBf16x2ByHalf(
          reg,
          BiasedScaleRowPair(BiasScaleBytes(static_cast<uint32_t>(scale), kE4m3Bf16ScaleBias), 0),
          0);
      const double unit = numerics::DecodeUE8M0(static_cast<uint8_t>(scale));
      const double want = numerics::DecodeE4M3(static_cast<uint8_t>(code)) * unit;
      // Products finer than BF16's subnormal grid (weights near 1e-40) cannot be exact.
      if ((std::bit_cast<uint32_t>(static_cast<float>(want)) & 0xFFFFu) != 0) continue;
      ASSERT_EQ(Half(product, 0), want) << "code " << code << " scale " << scale;
      ASSERT_EQ(Half(product, 1), unit) << "scale " << scale;
    }
  }
}

// A weight row's unit of a K32 block, as both bf16 kernels build it: value e of lane t's unit is
// the code at the block's logical position Bf16StepColumn^-1(8t + e) (4t + e, then 16 + 4t + e),
// times the block scale, exactly; FP4 from one lane word, E4M3 from the row's two runs.
TEST(Bf16Operands, WeightUnitIsTheExactScaledCodesInStepColumnOrder) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 2000; ++trial) {
    // Within both multipliers' range, and large enough that every E4M3 product is a normal BF16
    // (below, BF16 subnormals cannot hold them exactly: E4m3WeightTimesScaleIsExact).
    const uint32_t scale = 10 + rng() % 100;
    uint8_t lo[4], hi[4];
    for (int e = 0; e < 4; ++e) lo[e] = rng() % 16, hi[e] = rng() % 16;
    const uint32_t fp4_word = PlaceE2m1Bf16Word(lo, hi);
    uint32_t fp4[4];
    DecodeWeightUnit<true>(
        &fp4_word, BiasedScaleRowPair(BiasScaleBytes(scale, kE2m1Bf16ScaleBias), 0), fp4, 0);
    uint8_t e4m3_codes[8];
    uint32_t runs[2] = {};
    for (int e = 0; e < 8; ++e) {
      do {
        e4m3_codes[e] = static_cast<uint8_t>(rng());
      } while (IsE4m3Nan(e4m3_codes[e]) || (e4m3_codes[e] & 0x78u) == 0);  // normals: exact
      runs[e / 4] |= static_cast<uint32_t>(e4m3_codes[e]) << (8 * (e % 4));
    }
    uint32_t e4m3[4];
    DecodeWeightUnit<false>(runs, BiasedScaleRowPair(BiasScaleBytes(scale, kE4m3Bf16ScaleBias), 0),
                            e4m3, 0);
    const double unit = numerics::DecodeUE8M0(static_cast<uint8_t>(scale));
    for (int e = 0; e < 8; ++e) {
      const uint8_t code = e < 4 ? lo[e] : hi[e - 4];
      ASSERT_EQ(Half(fp4[e / 2], e % 2), numerics::DecodeE2M1(code) * unit) << trial << " " << e;
      ASSERT_EQ(Half(e4m3[e / 2], e % 2), numerics::DecodeE4M3(e4m3_codes[e]) * unit)
          << trial << " " << e;
    }
  }
}

// An activation: decode, times 2^120, times its scale (the codes this engine's quantizers write,
// 105 and up, and everything up to where BF16 overflows).
TEST(Bf16Operands, E4m3ActivationTimesScaleIsExact) {
  for (uint32_t code = 0; code < 256; ++code) {
    if (IsE4m3Nan(code)) continue;
    const uint32_t reg = E4m3PairToBf16(code << 16, 1);
    for (int scale = 105; scale <= 245; ++scale) {
      const uint32_t product = MulBf16x2(MulBf16x2(reg, kE4m3Bf16Undo), Bf16PowerPair(scale));
      const double want = numerics::DecodeE4M3(static_cast<uint8_t>(code)) *
                          numerics::DecodeUE8M0(static_cast<uint8_t>(scale));
      ASSERT_EQ(Half(product, 0), want) << "code " << code << " scale " << scale;
    }
  }
}

// A 32-value block as the bf16 role2 reads it: column c holds logical element l with
// Bf16BlockColumn(l) = c, the exact value code x scale; the columns are a permutation, and lane
// t's 16-byte unit (columns 8t..8t+7) holds its weight lane word's low run 4t..4t+3, then its
// high run 16+4t..16+4t+3, in order: the mma.m16n8k16 B registers of the block's two K16 steps.
TEST(Bf16Operands, BlockIsTheExactValuesInLaneUnitOrder) {
  std::mt19937 rng(23);
  int seen[32] = {};
  for (int l = 0; l < 32; ++l) ++seen[Bf16BlockColumn(l)];
  for (int c = 0; c < 32; ++c) ASSERT_EQ(seen[c], 1) << "column " << c;
  for (int t = 0; t < 4; ++t) {
    for (int e = 0; e < 4; ++e) {
      EXPECT_EQ(Bf16BlockColumn(4 * t + e), 8 * t + e);
      EXPECT_EQ(Bf16BlockColumn(16 + 4 * t + e), 8 * t + 4 + e);
    }
  }
  // Every block of a row is permuted in place.
  EXPECT_EQ(Bf16BlockColumn(32 * 7 + 5), 32 * 7 + Bf16BlockColumn(5));
  for (int trial = 0; trial < 2000; ++trial) {
    uint8_t codes[32];
    uint32_t words[8] = {};
    for (int l = 0; l < 32; ++l) {
      do {
        codes[l] = static_cast<uint8_t>(rng());
      } while (IsE4m3Nan(codes[l]));
      words[l / 4] |= static_cast<uint32_t>(codes[l]) << (8 * (l % 4));
    }
    const uint32_t scale = 105 + rng() % 40;
    for (int order : {kBf16MmaOrder, kBf16WgmmaOrder}) {
      uint32_t out[16];
      E4m3BlockToBf16(words, scale, order, out);
      for (int l = 0; l < 32; ++l) {
        const int c = Bf16BlockColumn(l, order);
        const double want =
            numerics::DecodeE4M3(codes[l]) * numerics::DecodeUE8M0(static_cast<uint8_t>(scale));
        ASSERT_EQ(Half(out[c / 2], c % 2), want)
            << "element " << l << " order " << order << " trial " << trial;
      }
    }
  }
}

// The wgmma order against the register-A wgmma m64nNk16 operand layout (PTX ISA): lane t's A
// registers of K16 step s are columns 2t, 2t+1 (register 0) and 2t+8, 2t+9 (register 2) of the
// step, and the tensor core reads the step's B column c at byte 2c of its 32 bytes of a row. The
// bf16-wgmma kernel fills step s's registers 0 and 2 with DecodeWeightUnit's registers 2s and
// 2s+1, which hold the lane word's logical positions 16 s + 4 t + {0, 1} and 16 s + 4 t + {2, 3}:
// the row must hold exactly those at the matching columns.
TEST(Bf16Operands, WgmmaOrderMeetsTheRegisterAFragments) {
  int seen[32] = {};
  for (int l = 0; l < 32; ++l) ++seen[Bf16BlockColumn(l, kBf16WgmmaOrder)];
  for (int c = 0; c < 32; ++c) ASSERT_EQ(seen[c], 1) << "column " << c;
  for (int s = 0; s < 2; ++s) {
    for (int t = 0; t < 4; ++t) {
      for (int e = 0; e < 2; ++e) {
        EXPECT_EQ(Bf16BlockColumn(16 * s + 4 * t + e, kBf16WgmmaOrder), 16 * s + 2 * t + e);
        EXPECT_EQ(Bf16BlockColumn(16 * s + 4 * t + 2 + e, kBf16WgmmaOrder), 16 * s + 8 + 2 * t + e);
      }
    }
  }
  EXPECT_EQ(Bf16BlockColumn(32 * 3 + 9, kBf16WgmmaOrder),
            32 * 3 + Bf16BlockColumn(9, kBf16WgmmaOrder));
  // Bf16BlockPairAt inverts both orders on pairs.
  for (int order : {kBf16MmaOrder, kBf16WgmmaOrder}) {
    for (int lp = 0; lp < 16; ++lp) {
      const int c = Bf16BlockColumn(2 * lp, order);
      ASSERT_EQ(c % 2, 0);
      ASSERT_EQ(Bf16BlockColumn(2 * lp + 1, order), c + 1);
      EXPECT_EQ(Bf16BlockPairAt(c / 2, order), lp) << "order " << order;
    }
  }
}

// The A fragment of mma.m16n8k16 (and a warp's share of wgmma m64nNk16): register i of K16 step
// h holds row g + 8 (i % 2) at columns 2t + 8 (i / 2), +1; in a lane word's logical positions
// those are 16 h + 4 t + 2 (i / 2), +1: pair i / 2 of run h of that row.
TEST(Bf16Operands, BlockFragmentsFollowThePtxLayout) {
  // E4M3 words: row g's low and high runs, then row g + 8's; every code distinct.
  const uint32_t words[4] = {0x38302820u, 0x3C342C24u, 0x3A322A22u, 0x3E362E26u};
  for (int kb = 0; kb < 4; ++kb) {
    const uint32_t scale_word = BiasScaleBytes(0x7B7C7D7Eu, kE4m3Bf16ScaleBias);
    uint32_t a[2][4];
    DecodeBlockFragments<false>(words, scale_word, kb, a);
    for (int h = 0; h < 2; ++h) {
      uint32_t step[4];  // the one-step form the bf16-wgmma kernel's merged blocks decode
      DecodeStepFragments<false>(words, scale_word, kb, h, step);
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(step[i], a[h][i]) << "block " << kb << " step " << h << " register " << i;
        const int row8 = i % 2;
        // The row's multiplier: byte 2 (kb % 2) + row8 of the scale word.
        const uint32_t code = (0x7B7C7D7Eu >> (8 * (2 * (kb % 2) + row8))) & 0xFFu;
        const uint32_t multiplier = Bf16PowerPair(code + kE4m3Bf16ScaleBias);
        EXPECT_EQ(a[h][i], MulBf16x2(E4m3PairToBf16(words[2 * row8 + h], i / 2), multiplier))
            << "block " << kb << " step " << h << " register " << i;
      }
    }
  }
}

}  // namespace
}  // namespace gcmoe::kernels
