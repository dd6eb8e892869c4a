// UE8M0 block scales read straight out of the 32-bit words the role2 kernels load them in (four
// codes per word): each decode moves the code into a float's exponent field. Host and device,
// so the CPU tests check them against engine/numerics.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace gcmoe::kernels {

GCMOE_HOST_DEVICE inline float FloatFromBits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
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
