#include "common/number_formats.h"

#include <bit>
#include <cmath>
#include <limits>

namespace gcmoe::numerics {
namespace {

uint32_t FloatBits(float value) { return std::bit_cast<uint32_t>(value); }
float BitsFloat(uint32_t bits) { return std::bit_cast<float>(bits); }

// Rounds |value| (given as its IEEE bits, sign cleared, finite, below the format's saturation
// threshold) to a small float format with `man_bits` mantissa bits whose smallest normal
// exponent is `min_exp`. Returns the magnitude code (exponent and mantissa fields, no sign).
//
// Exact by construction: normal results come from the float's own exponent and mantissa fields
// with round-to-nearest-even on the dropped bits; subnormal results (below 2^min_exp) are
// multiples of 2^(min_exp - man_bits), computed as an integer quotient with an exact remainder.
// A mantissa carry moves into the exponent field, which is the correct next code in both cases
// (including the step from the largest subnormal to the smallest normal).
uint32_t RoundMagnitude(uint32_t abs_bits, int man_bits, int min_exp) {
  const int exp = static_cast<int>(abs_bits >> 23) - 127;  // unbiased; -127 for float subnormals
  if (exp >= min_exp) {
    const int drop = 23 - man_bits;
    const uint32_t mant = abs_bits & 0x7FFFFFu;
    uint32_t code = (static_cast<uint32_t>(exp - min_exp + 1) << man_bits) | (mant >> drop);
    const uint32_t rest = mant & ((1u << drop) - 1);
    const uint32_t half = 1u << (drop - 1);
    if (rest > half || (rest == half && (code & 1u))) ++code;
    return code;
  }
  // Subnormal in the target format: value = q * 2^(min_exp - man_bits). Work on the float's
  // significand as an integer (with the implicit bit when the float is normal).
  if (abs_bits == 0) return 0;
  uint64_t significand = abs_bits & 0x7FFFFFu;
  int sig_exp = -149;  // value = significand * 2^sig_exp
  if ((abs_bits >> 23) != 0) {
    significand |= 0x800000u;
    sig_exp = exp - 23;
  }
  const int unit_exp = min_exp - man_bits;  // exponent of one subnormal step
  const int shift = unit_exp - sig_exp;     // > 0: the value has bits below one step
  if (shift >= 64) return 0;
  if (shift <= 0) return static_cast<uint32_t>(significand << -shift);
  const uint64_t q = significand >> shift;
  const uint64_t rest = significand & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  uint64_t code = q;
  if (rest > half || (rest == half && (q & 1u))) ++code;
  return static_cast<uint32_t>(code);
}

// Decoded tables, built once from the bit fields (E4M3: 256 codes, E2M1: 16 codes).
struct Tables {
  float e4m3[256];
  float e2m1[16];
  Tables() {
    for (int code = 0; code < 256; ++code) {
      const int sign = code >> 7;
      const int exp = (code >> 3) & 0xF;
      const int man = code & 0x7;
      float magnitude;
      if (exp == 0xF && man == 0x7) {
        magnitude = std::numeric_limits<float>::quiet_NaN();
      } else if (exp == 0) {
        magnitude = std::ldexp(static_cast<float>(man), -9);
      } else {
        magnitude = std::ldexp(static_cast<float>(8 + man), exp - 7 - 3);
      }
      e4m3[code] = sign ? -magnitude : magnitude;
    }
    for (int code = 0; code < 16; ++code) {
      const int sign = code >> 3;
      const int exp = (code >> 1) & 0x3;
      const int man = code & 0x1;
      const float magnitude = exp == 0 ? 0.5f * static_cast<float>(man)
                                       : std::ldexp(static_cast<float>(2 + man), exp - 1 - 1);
      e2m1[code] = sign ? -magnitude : magnitude;
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

// 2^e as a float for e in [-127, 127] (2^-127 is a float subnormal, still exact).
float Pow2(int e) {
  if (e >= -126) return BitsFloat(static_cast<uint32_t>(e + 127) << 23);
  return BitsFloat(0x00400000u);  // 2^-127
}

// Largest magnitude of a block; NaN values are ignored, as fmaxf does on the device.
float BlockAmax(const float* x) {
  float amax = 0.0f;
  for (int i = 0; i < kBlock; ++i) {
    const float a = std::fabs(x[i]);
    if (a > amax) amax = a;
  }
  return amax;
}

}  // namespace

float DecodeE4M3(uint8_t code) { return GetTables().e4m3[code]; }

uint8_t EncodeE4M3(float value) {
  const uint32_t bits = FloatBits(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return sign | 0x7F;           // NaN
  if (abs_bits >= FloatBits(kE4M3Max)) return sign | 0x7E;  // saturate (Inf included)
  // Below 448 the rounding can reach 448 (0x7E) at most, never the NaN code.
  return sign | static_cast<uint8_t>(RoundMagnitude(abs_bits, 3, -6));
}

float DecodeE2M1(uint8_t nibble) { return GetTables().e2m1[nibble & 0xF]; }

uint8_t EncodeE2M1(float value) {
  const uint32_t bits = FloatBits(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 28) & 0x8u);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return sign | 0x7;           // NaN: no NaN code, saturate
  if (abs_bits >= FloatBits(kE2M1Max)) return sign | 0x7;  // saturate (Inf included)
  return sign | static_cast<uint8_t>(RoundMagnitude(abs_bits, 1, 0));
}

float DecodeUE8M0(uint8_t code) {
  if (code == 255) return std::numeric_limits<float>::quiet_NaN();
  return Pow2(static_cast<int>(code) - 127);
}

uint8_t BlockScaleCode(float amax, float fmt_max) {
  // fmaxf semantics: a NaN amax takes the floor.
  const float floored = amax > 1e-4f ? amax : 1e-4f;
  const float ratio = floored / fmt_max;
  const uint32_t bits = FloatBits(ratio) & 0x7FFFFFFFu;
  int e;
  if (bits >= 0x7F800000u) {
    e = 127;  // Inf (or NaN from a NaN fmt_max): the largest scale
  } else if ((bits >> 23) != 0) {
    // ratio = 1.m * 2^E: ceil(log2) is E when m == 0, else E + 1.
    e = static_cast<int>(bits >> 23) - 127 + ((bits & 0x7FFFFFu) != 0 ? 1 : 0);
  } else if (bits == 0) {
    e = -127;
  } else {
    // Subnormal ratio = m * 2^-149: ceil(log2) = -149 + ceil(log2(m)).
    const int width = std::bit_width(bits);  // 2^(width-1) <= m < 2^width
    e = -149 + width - 1 + (std::has_single_bit(bits) ? 0 : 1);
  }
  if (e < -127) e = -127;
  if (e > 127) e = 127;
  return static_cast<uint8_t>(e + 127);
}

uint16_t FloatToBF16(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);  // NaN stays NaN (quiet)
  }
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float BF16ToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

float FP16ToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1Fu;
  const uint32_t man = bits & 0x3FFu;
  if (exp == 0x1F) return BitsFloat(sign | 0x7F800000u | (man << 13));  // Inf / NaN
  if (exp != 0) return BitsFloat(sign | ((exp + 112) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24, exact in float.
  const float magnitude = std::ldexp(static_cast<float>(man), -24);
  return sign ? -magnitude : magnitude;
}

void QuantizeE4M3K32(const float* x, int n, uint8_t* q, uint8_t* scales) {
  for (int b = 0; b < n / kBlock; ++b) {
    const float* block = x + b * kBlock;
    const uint8_t code = BlockScaleCode(BlockAmax(block), kE4M3Max);
    scales[b] = code;
    // Multiplying by 2^-e is the same correctly rounded result as dividing by 2^e: both
    // operands are exact powers of two.
    const float inverse = Pow2(127 - static_cast<int>(code));
    for (int i = 0; i < kBlock; ++i) q[b * kBlock + i] = EncodeE4M3(block[i] * inverse);
  }
}

void DequantizeE4M3K32(const uint8_t* q, const uint8_t* scales, int n, float* x) {
  const Tables& t = GetTables();
  for (int b = 0; b < n / kBlock; ++b) {
    const float scale = DecodeUE8M0(scales[b]);
    for (int i = 0; i < kBlock; ++i) x[b * kBlock + i] = t.e4m3[q[b * kBlock + i]] * scale;
  }
}

void QuantizeE2M1K32(const float* x, int n, uint8_t* packed, uint8_t* scales) {
  for (int b = 0; b < n / kBlock; ++b) {
    const float* block = x + b * kBlock;
    const uint8_t code = BlockScaleCode(BlockAmax(block), kE2M1Max);
    scales[b] = code;
    const float inverse = Pow2(127 - static_cast<int>(code));
    for (int i = 0; i < kBlock; i += 2) {
      const uint8_t lo = EncodeE2M1(block[i] * inverse);
      const uint8_t hi = EncodeE2M1(block[i + 1] * inverse);
      packed[(b * kBlock + i) / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void DequantizeE2M1K32(const uint8_t* packed, const uint8_t* scales, int n, float* x) {
  const Tables& t = GetTables();
  for (int b = 0; b < n / kBlock; ++b) {
    const float scale = DecodeUE8M0(scales[b]);
    for (int i = 0; i < kBlock; i += 2) {
      const uint8_t byte = packed[(b * kBlock + i) / 2];
      x[b * kBlock + i] = t.e2m1[byte & 0xF] * scale;
      x[b * kBlock + i + 1] = t.e2m1[byte >> 4] * scale;
    }
  }
}

}  // namespace gcmoe::numerics
