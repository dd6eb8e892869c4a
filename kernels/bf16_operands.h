// Operands of the bf16 role2 (grouped_gemm_wgmma_fp8_fp4_sm90.cu) as BF16 bit patterns, host and
// device, so the CPU tests check them against engine/numerics: E4M3 codes (the activations, the
// shared expert's weights) decoded by bit placement, and the UE8M0 block scales as BF16
// multipliers that turn the decoded codes into exact values. (The E2M1 lane-word decode is
// weight_tiles_sm90.h's.) Every product here is of a code with at most 4 significant bits and a
// power of two: exact in BF16 wherever the result is in range.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/scale_bytes.h"

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

// The multiplier that makes a decoded weight exact: UE8M0 code c (byte b of `word`) plus `bias`
// as the BF16 exponent field, i.e. 2^(c - 127) times 2^126 (E2M1, bias 126) or 2^120 (E4M3,
// bias 120), in both halves. Valid while c + bias <= 254: codes up to kMaxBf16ScaleCode.
inline constexpr uint32_t kE2m1Bf16ScaleBias = 126;
inline constexpr uint32_t kE4m3Bf16ScaleBias = 120;
GCMOE_HOST_DEVICE constexpr int MaxBf16ScaleCode(uint32_t bias) {
  return 254 - static_cast<int>(bias);
}
GCMOE_HOST_DEVICE inline uint32_t ScaleBytePair(uint32_t word, int b, uint32_t bias) {
#if defined(__CUDA_ARCH__)
  const uint32_t v = __byte_perm(word, 0u, 0x4040u | (b << 8) | b);  // the byte in both halves
#else
  const uint32_t v = ((word >> (8 * b)) & 0xFFu) * 0x00010001u;
#endif
  return (v + bias * 0x00010001u) << 7;
}

// Activations: the E4M3 decode times 2^120, then times the UE8M0 scale (codes >= 1; this
// engine's quantizers write >= 105), two multiplies so that no multiplier leaves BF16's range.
inline constexpr uint32_t kE4m3Bf16Undo = Bf16PowerPair(127 + 120);

// ---- activations as the bf16 role2 reads them
// ----------------------------------------------------
//
// The bf16 role2 reads activations as BF16 rows written once (role1's pull, the W1 epilogue):
// the exact values of the E4M3 codes times their block scale, each 16-value window of a row in
// the column order of the wgmma K16 step that multiplies it. A weight lane word's low run
// (logical positions 4t..4t+3 of a 32-block, weight_tiles_sm90.h) sits at fragment columns 2t,
// 2t + 1, 2t + 8, 2t + 9, so column pair P of a window holds logical pair 2P (P < 4) or
// 2(P - 4) + 1: the even pairs first (core matrix 0, 16 bytes), then the odd ones (core 1).
GCMOE_HOST_DEVICE constexpr int Bf16WindowColumn(int logical) {
  const int pair = logical / 2;
  return 2 * (pair % 2 == 0 ? pair / 2 : 4 + pair / 2) + logical % 2;
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
    uint32_t bits;
    std::memcpy(&bits, &p, sizeof bits);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    d |= (bits >> 16) << (16 * h);
  }
  return d;
#endif
}

// One 16-value window: its E4M3 codes (4 words, logical order) and the block's UE8M0 scale code
// (>= 1) to 8 BF16x2 words in column order, core 0 (out[0..3]) then core 1 (out[4..7]).
GCMOE_HOST_DEVICE inline void E4m3WindowToBf16(const uint32_t (&codes)[4], uint32_t scale_code,
                                               uint32_t (&out)[8]) {
  const uint32_t scale = Bf16PowerPair(scale_code);
  for (int i = 0; i < 4; ++i) {
    out[i] = MulBf16x2(MulBf16x2(E4m3PairToBf16(codes[i], 0), kE4m3Bf16Undo), scale);
    out[4 + i] = MulBf16x2(MulBf16x2(E4m3PairToBf16(codes[i], 1), kE4m3Bf16Undo), scale);
  }
}

}  // namespace gcmoe::kernels
