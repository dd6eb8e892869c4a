// UE8M0 block scales read straight out of the 32-bit words the role2 kernels load them in (four
// codes per word): each decode moves the code into a float's exponent field. Host and device,
// so the CPU tests check them against engine/numerics.
#pragma once

#include <bit>
#include <cstdint>

#include "kernels/host_device.h"

namespace gcmoe::kernels {

// A float's bits and back: the intrinsics on the device, std::bit_cast on the host.
GCMOE_HOST_DEVICE inline float FloatFromBits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}
GCMOE_HOST_DEVICE inline uint32_t BitsFromFloat(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<uint32_t>(f);
#endif
}

// The UE8M0 code of an E4M3 block, ceil(log2(max(amax, 1e-4) / 448)) (DESIGN.md §4; a NaN amax
// takes the floor), without the division. With max(amax, 1e-4) = m 2^E, m in [1, 2), the
// quotient is (m / 1.75) 2^(E - 8), and its nearest float is a power of two only when m = 1.75:
// any other m is at least 2^-23 from 1.75, and 2^-23 / 1.75 is more than half an ulp of 1 on
// either side, so the quotient lies strictly between 2^(E - 9) and 2^(E - 8) for m < 1.75 and
// between 2^(E - 8) and 2^(E - 7) for m > 1.75. Its ceiling is E - 8 + (m > 1.75): codes 105
// (the floor) to 247, or 254 for an infinite amax. engine/numerics BlockScaleCode, which
// divides, is its test.
GCMOE_HOST_DEVICE inline uint32_t E4m3BlockScaleCode(float amax) {
  const uint32_t bits = BitsFromFloat(amax > 1e-4f ? amax : 1e-4f);
  if (bits >= 0x7F800000u) return 254;
  return (bits >> 23) - 8 + ((bits & 0x7FFFFFu) > 0x600000u ? 1u : 0u);
}

// Byte b (0..3; a compile-time constant in the hot loops) of `word` in a float's exponent field:
// the bits of 2^(code-127) for codes 1..254, and 0 for code 0. Two instructions.
GCMOE_HOST_DEVICE constexpr uint32_t ScaleByteAsExponent(uint32_t word, int b) {
  return (b == 3 ? word >> 1 : word << (23 - 8 * b)) & 0x7F800000u;
}

// UE8M0 code in byte b of `word` -> 2^(code-127), every code but the NaN 255 (weights are checked
// at load, so it never reaches the device). Code 0 (2^-127, a subnormal) is the only one whose
// exponent bits fall below 0x00800000.
GCMOE_HOST_DEVICE inline float WeightScale(uint32_t word, int b) {
  const uint32_t bits = ScaleByteAsExponent(word, b);
  return FloatFromBits(bits > 0x00400000u ? bits : 0x00400000u);
}

// The same, one instruction less, for the activation scales: codes this engine's quantizers
// wrote, never 0 (BlockScaleCode floors amax at 1e-4, so an E4M3 block's code is >= 105).
GCMOE_HOST_DEVICE inline float ActivationScale(uint32_t word, int b) {
  return FloatFromBits(ScaleByteAsExponent(word, b));
}

}  // namespace gcmoe::kernels
