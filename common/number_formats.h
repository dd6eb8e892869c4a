// Number formats and block scaling, exactly as DESIGN.md §4 (OCP Microscaling bit patterns):
// the bit patterns of the API's tensors and of the weights. Every backend follows these
// functions bit for bit (the CUDA kernels mirror them on device), and the client encodes its
// requests with them; engine/numerics.h adds the comparison metrics.
#pragma once

#include <cstdint>

namespace gcmoe::numerics {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE2M1Max = 6.0f;
inline constexpr int kBlock = 32;  // values per UE8M0 scale, along the contraction dimension

// E4M3 ("e4m3fn"): 1-4-3, bias 7, no infinities, NaN = S.1111.111.
float DecodeE4M3(uint8_t code);
// Round to nearest even, saturate to +-448; NaN maps to 0x7F (sign kept).
uint8_t EncodeE4M3(float value);

// E2M1 (FP4), one code in the low 4 bits: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
float DecodeE2M1(uint8_t nibble);
// Round to nearest even, saturate to +-6. NaN maps to +6 with its sign (E2M1 has no NaN).
uint8_t EncodeE2M1(float value);

// UE8M0: value 2^(code - 127); 255 is NaN.
float DecodeUE8M0(uint8_t code);

// Block scale exponent for a block whose largest magnitude is amax:
//   ratio = max(amax, 1e-4f) / fmt_max      (FP32 division, round to nearest even)
//   e = ceil(log2(ratio)), computed exactly from the binary exponent of ratio, clamped to
//   [-127, 127]. Returns the UE8M0 code e + 127.
uint8_t BlockScaleCode(float amax, float fmt_max);

// BF16 (round to nearest even; NaN stays NaN).
uint16_t FloatToBF16(float value);
float BF16ToFloat(uint16_t bits);
inline float RoundToBF16(float value) { return BF16ToFloat(FloatToBF16(value)); }
// IEEE binary16 -> float (for FP16 request tensors).
float FP16ToFloat(uint16_t bits);

// E4M3 with one UE8M0 scale per 32 values. n must be a multiple of 32.
//   q: [n] E4M3 codes, scales: [n/32] UE8M0 codes.
void QuantizeE4M3K32(const float* x, int n, uint8_t* q, uint8_t* scales);
void DequantizeE4M3K32(const uint8_t* q, const uint8_t* scales, int n, float* x);

// E2M1 with one UE8M0 scale per 32 values, packed two per byte (element 2i in the low nibble).
//   packed: [n/2] bytes, scales: [n/32] UE8M0 codes.
void QuantizeE2M1K32(const float* x, int n, uint8_t* packed, uint8_t* scales);
void DequantizeE2M1K32(const uint8_t* packed, const uint8_t* scales, int n, float* x);

}  // namespace gcmoe::numerics
