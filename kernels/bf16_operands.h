// Operands of role2 (grouped_gemm_sm90.cu) as BF16 bit patterns, host and
// device, so the CPU tests check them against engine/numerics: E4M3 codes (the activations, the
// shared expert's weights) decoded by bit placement, and the UE8M0 block scales as BF16
// multipliers that turn the decoded codes into exact values. (The E2M1 lane-word decode is
// weight_tiles_sm90.h's.) Every product here is of a code with at most 4 significant bits and a
// power of two: exact in BF16 wherever the result is in range.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/scale_bytes.h"
#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::kernels {

// An E4M3 code s eeee mmm at BF16 bits 15 and 10..4 is the BF16 of its value times 2^-120 (bias
// 7 against 127; E4M3 subnormals land on BF16 subnormals). Bytes 2j and 2j + 1 of `word` (j = 0
// or 1) as one BF16x2 register, byte 2j in the low half. The NaN code becomes a finite number:
// no quantizer of this engine writes it.
inline constexpr float kE4m3Bf16DecodeScale = 0x1p120f;
GCMOE_HOST_DEVICE inline uint32_t E4m3PairToBf16(uint32_t word, int j) {
#if defined(__CUDA_ARCH__)
  const uint32_t x = __byte_perm(word, 0u, j == 0 ? 0x1404u : 0x3424u);  // bytes to 15..8, 31..24
#else
  const uint32_t x = j == 0 ? ((word << 8) & 0x0000FF00u) | ((word << 16) & 0xFF000000u)
                            : ((word >> 8) & 0x0000FF00u) | (word & 0xFF000000u);
#endif
  return (x & 0x80008000u) | ((x >> 4) & 0x07F007F0u);
}

// BF16x2 of 2^(field - 127) in both halves (field 1..254: normal powers of two).
GCMOE_HOST_DEVICE constexpr uint32_t Bf16PowerPair(uint32_t field) { return field * 0x00800080u; }

// The multipliers that make decoded weights exact: UE8M0 code c plus `bias` as the BF16 exponent
// field, i.e. 2^(c - 127) times 2^126 (E2M1, bias 126) or 2^120 (E4M3, bias 120). Valid while
// c + bias <= 254: codes up to MaxBf16ScaleCode. A scale word holds four codes, rows g and g + 8 of
// two K32 blocks: BiasScaleBytes adds `bias` to every byte at once (no byte carries into the next,
// as every code is in range: the load shifts larger ones, StepHeader::scale_shift), and
// BiasedScaleRowPair takes bytes 2 half (row g) and 2 half + 1 (row g + 8) of the result into the
// exponent fields of the low and the high half: one byte permute and one shift for both rows of a
// block, which ptxas issues on the FMA pipe (IMAD.SHL; adding the bias per multiplier made it an
// ALU LEA). Each row's registers are multiplied by its half (MulBf16x2ByHalf); one permute and
// shift per row, each byte in both halves, cost two more instructions per block (1-3 % slower).
inline constexpr uint32_t kE2m1Bf16ScaleBias = 126;
inline constexpr uint32_t kE4m3Bf16ScaleBias = 120;
GCMOE_HOST_DEVICE constexpr int MaxBf16ScaleCode(uint32_t bias) {
  return 254 - static_cast<int>(bias);
}
GCMOE_HOST_DEVICE constexpr uint32_t BiasScaleBytes(uint32_t word, uint32_t bias) {
  return word + bias * 0x01010101u;
}
GCMOE_HOST_DEVICE inline uint32_t BiasedScaleRowPair(uint32_t biased, int half) {
#if defined(__CUDA_ARCH__)
  const uint32_t v = __byte_perm(biased, 0u, 0x4040u | ((2 * half + 1) << 8) | (2 * half));
#else
  const uint32_t v =
      ((biased >> (16 * half)) & 0xFFu) | (((biased >> (16 * half + 8)) & 0xFFu) << 16);
#endif
  return v << 7;
}

// Activations: the E4M3 decode times 2^120, then times the UE8M0 scale (codes >= 1; this
// engine's quantizers write >= 105), two multiplies so that no multiplier leaves BF16's range.
inline constexpr uint32_t kE4m3Bf16Undo = Bf16PowerPair(127 + 120);

// ---- activations as role2 reads them --------------------------------------------------
//
// role2 reads activations as BF16 rows written once (role1's pull, the W1 epilogue):
// the exact values of the E4M3 codes times their block scale, each 32-value block of a row
// permuted in place so that a weight lane word's values meet the activations they multiply. A
// weight lane word of lane t holds the block's logical positions 4t..4t+3 (its low run, K16 step
// 0 of the block) and 16+4t..16+4t+3 (its high run, step 1) (weight_tiles_sm90.h), as the A
// registers of columns 2t, 2t+1 (4t, 4t+1 of the run) and 2t+8, 2t+9 (4t+2, 4t+3). Two orders
// (LayerParams::act_bf16), one per MMA:
//   kBf16MmaOrder (mma.sync m16n8k16, whose B registers are loaded by the kernel): lane t's eight
//     values one 16-byte unit, the b0, b1 of both steps: logical r = 16 hi + 4 t + e at
//     8 t + 4 hi + e.
//   kBf16WgmmaOrder (register-A wgmma, whose B the tensor core reads from shared memory in
//     column order): K16 step s's column 2t + e holds logical 16 s + 4 t + e and column
//     2t + 8 + e logical 16 s + 4 t + 2 + e: logical 16 s + 4 t + 2 m + e at 16 s + 8 m + 2 t + e.
inline constexpr int kBf16MmaOrder = 1;
inline constexpr int kBf16WgmmaOrder = 2;
GCMOE_HOST_DEVICE constexpr int Bf16BlockColumn(int logical, int order = kBf16MmaOrder) {
  const int r = logical % 32;
  return logical - r +
         (order == kBf16WgmmaOrder ? 16 * (r / 16) + 8 * ((r / 2) % 2) + 2 * ((r / 4) % 4) + r % 2
                                   : 8 * ((r / 4) % 4) + 4 * (r / 16) + r % 4);
}
// The logical pair (positions 2 lp, 2 lp + 1) stored at BF16x2 slot i (columns 2 i, 2 i + 1) of
// a block: the inverse of Bf16BlockColumn on pairs.
GCMOE_HOST_DEVICE constexpr int Bf16BlockPairAt(int i, int order) {
  return order == kBf16WgmmaOrder ? 8 * (i / 8) + 2 * (i % 4) + (i / 4) % 2
                                  : 8 * ((i / 2) % 2) + 2 * (i / 4) + i % 2;
}

// d = a * b per BF16 half, rounded to nearest even (subnormals kept: PTX has no .ftz for BF16).
GCMOE_HOST_DEVICE inline uint32_t MulBf16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  uint32_t d = 0;
  for (int h = 0; h < 2; ++h) {
    const float p = FloatFromBits((a >> (16 * h)) << 16) * FloatFromBits((b >> (16 * h)) << 16);
    uint32_t bits = BitsFromFloat(p);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    d |= (bits >> 16) << (16 * h);
  }
  return d;
#endif
}

// d = a * (half h of m in both halves), per BF16 half: the multiply's operand selector
// (.H0_H0 / .H1_H1 in SASS) where ptxas folds the half's broadcast into it.
GCMOE_HOST_DEVICE inline uint32_t MulBf16x2ByHalf(uint32_t a, uint32_t m, int h) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  if (h == 0) {
    asm("{\n.reg .b16 lo, hi;\n.reg .b32 b;\nmov.b32 {lo, hi}, %2;\nmov.b32 b, {lo, lo};\n"
        "mul.rn.bf16x2 %0, %1, b;\n}"
        : "=r"(d)
        : "r"(a), "r"(m));
  } else {
    asm("{\n.reg .b16 lo, hi;\n.reg .b32 b;\nmov.b32 {lo, hi}, %2;\nmov.b32 b, {hi, hi};\n"
        "mul.rn.bf16x2 %0, %1, b;\n}"
        : "=r"(d)
        : "r"(a), "r"(m));
  }
  return d;
#else
  const uint32_t half = (m >> (16 * h)) & 0xFFFFu;
  return MulBf16x2(a, half * 0x00010001u);
#endif
}

// One weight row's 8 values of a K32 block as exact BF16 (four BF16x2 registers, in MMA column
// order: the block's logical positions 4t..4t+3, then 16+4t..16+4t+3, of lane t), from its codes
// and its multiplier, half `h` of `multipliers` (BiasedScaleRowPair). kFp4: words[0] is the row's
// E2M1 lane word (TileFormat::kE2M1Bf16); otherwise words[0], words[1] are its E4M3 low and high
// runs. Register i is the A fragment's register of K16 step i / 2 at columns 2t (i even) or 2t + 8
// (i odd).
template <bool kFp4>
GCMOE_HOST_DEVICE inline void DecodeWeightUnit(const uint32_t* words, uint32_t multipliers,
                                               uint32_t (&unit)[4], int h) {
  if constexpr (kFp4) {
    const Bf16Quad q = DecodeE2m1Bf16Word(words[0]);
    for (int i = 0; i < 4; ++i) unit[i] = MulBf16x2ByHalf(q.r[i], multipliers, h);
  } else {
    for (int i = 0; i < 4; ++i) {
      unit[i] = MulBf16x2ByHalf(E4m3PairToBf16(words[i / 2], i % 2), multipliers, h);
    }
  }
}

// K32 block kb (0..3 of a chunk) of a warp's rows g and g + 8 as the A registers of the block's
// two K16 steps, the same for mma.m16n8k16 and for a warp's share of wgmma m64nNk16: a[h] holds
// step h's row g at columns 2t, 2t + 1, row g + 8 there, then both rows at 2t + 8, 2t + 9.
// `words`: the block's lane words (FP4: rows g, g + 8; E4M3: row g's low and high runs, then
// row g + 8's); `scale_word`: the lane's biased scale word of the block's half of the chunk
// (BiasScaleBytes), whose bytes 2 (kb % 2) and 2 (kb % 2) + 1 are rows g and g + 8.
template <bool kFp4>
GCMOE_HOST_DEVICE inline void DecodeBlockFragments(const uint32_t* words, uint32_t scale_word,
                                                   int kb, uint32_t (&a)[2][4]) {
  uint32_t row_g[4];
  uint32_t row_g8[4];
  const uint32_t multipliers = BiasedScaleRowPair(scale_word, kb & 1);
  DecodeWeightUnit<kFp4>(&words[0], multipliers, row_g, 0);
  DecodeWeightUnit<kFp4>(&words[kFp4 ? 1 : 2], multipliers, row_g8, 1);
  for (int h = 0; h < 2; ++h) {
    a[h][0] = row_g[2 * h];
    a[h][1] = row_g8[2 * h];
    a[h][2] = row_g[2 * h + 1];
    a[h][3] = row_g8[2 * h + 1];
  }
}
// K16 step h of the same block alone (a[h] above), for a caller with registers for one step:
// inlined with a constant h, the other step's decode is dead code.
template <bool kFp4>
GCMOE_HOST_DEVICE inline void DecodeStepFragments(const uint32_t* words, uint32_t scale_word,
                                                  int kb, int h, uint32_t (&a)[4]) {
  uint32_t both[2][4];
  DecodeBlockFragments<kFp4>(words, scale_word, kb, both);
  for (int i = 0; i < 4; ++i) a[i] = both[h][i];
}

// One 32-value block: its E4M3 codes (8 words, logical order: word q holds positions
// 4q..4q+3) and the block's UE8M0 scale code (>= 1) to 16 BF16x2 words in `order`
// (kBf16MmaOrder or kBf16WgmmaOrder; selected per word, never a computed register index).
GCMOE_HOST_DEVICE inline void E4m3BlockToBf16(const uint32_t (&codes)[8], uint32_t scale_code,
                                              int order, uint32_t (&out)[16]) {
  const uint32_t scale = Bf16PowerPair(scale_code);
  uint32_t pairs[16];  // logical pair lp: positions 2 lp, 2 lp + 1
  for (int lp = 0; lp < 16; ++lp) {
    pairs[lp] = MulBf16x2(MulBf16x2(E4m3PairToBf16(codes[lp / 2], lp % 2), kE4m3Bf16Undo), scale);
  }
  for (int i = 0; i < 16; ++i) {
    out[i] = order == kBf16WgmmaOrder ? pairs[Bf16BlockPairAt(i, kBf16WgmmaOrder)]
                                      : pairs[Bf16BlockPairAt(i, kBf16MmaOrder)];
  }
}

}  // namespace gcmoe::kernels
