// Activation quantization on the device (DESIGN.md §4 step 1): one request row, BF16 / FP32 /
// FP16, to E4M3 with one UE8M0 scale per 32 values, bit for bit numerics::QuantizeE4M3K32.
// An FP8 request row (codes + scales) is copied as it is. Run by role1, one thread per 32-value
// block (QuantizeBlock), and by the all-to-all baseline, one warp per row (QuantizeRowWarp).
// For role2 the same values also as its BF16 rows (bf16_operands.h).
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "kernels/bf16_operands.h"
#include "kernels/device_common.cuh"

namespace gcmoe::kernels {

// One 32-value block (8 words of E4M3 codes, its scale code) as BF16 in `order`
// (LayerParams::act_bf16, bf16_operands.h) at `dst` and at `also`, each if not null.
__device__ __forceinline__ void StoreBf16Block(const uint32_t (&codes)[8], uint32_t scale_code,
                                               int order, uint16_t* dst, uint16_t* also = nullptr) {
  uint32_t out[16];
  E4m3BlockToBf16(codes, scale_code, order, out);
  for (uint16_t* to : {dst, also}) {
    if (to == nullptr) continue;
    uint4* d = reinterpret_cast<uint4*>(to);
#pragma unroll
    for (int u = 0; u < 4; ++u)
      d[u] = make_uint4(out[4 * u], out[4 * u + 1], out[4 * u + 2], out[4 * u + 3]);
  }
}

// Block b (32 values) of an E4M3 row (codes, scales), loaded: its codes and the scale word that
// holds its scale code. `fresh`: another GPU's row, read afresh (ld.cv), never from a line this
// GPU cached earlier.
__device__ __forceinline__ void LoadE4m3Block(const uint8_t* codes, const uint8_t* scales, int b,
                                              bool fresh, uint4* lo, uint4* hi,
                                              uint32_t* scale_word) {
  const uint8_t* src = codes + b * 32;
  *lo = fresh ? LdCv128(src) : LdCg128(src);
  *hi = fresh ? LdCv128(src + 16) : LdCg128(src + 16);
  const uint32_t* word = reinterpret_cast<const uint32_t*>(scales + (b / 4) * 4);
  *scale_word = fresh ? LdCv32(word) : LdCg32(word);
}

// A block LoadE4m3Block loaded, stored as role2's BF16 values of block b of `dst_row`.
__device__ __forceinline__ void StoreE4m3BlockAsBf16(uint4 lo, uint4 hi, uint32_t scale_word, int b,
                                                     int order, uint16_t* dst_row) {
  const uint32_t block[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  StoreBf16Block(block, (scale_word >> (8 * (b % 4))) & 0xFFu, order, dst_row + b * 32);
}

// Block b (32 values) of an E4M3 row (codes, scales) as role2's BF16 values, one thread.
__device__ __forceinline__ void E4m3BlockToBf16Row(const uint8_t* codes, const uint8_t* scales,
                                                   int b, bool fresh, int order, uint16_t* dst) {
  uint4 lo, hi;
  uint32_t scale_word;
  LoadE4m3Block(codes, scales, b, fresh, &lo, &hi, &scale_word);
  StoreE4m3BlockAsBf16(lo, hi, scale_word, b, order, dst);
}

// role2's BF16 row of an E4M3 row: lane per 32-value block.
__device__ __forceinline__ void WarpRowToBf16(const uint8_t* codes, const uint8_t* scales,
                                              int hidden_size, int lane, bool fresh, int order,
                                              uint16_t* dst) {
#pragma unroll 2
  for (int b = lane; b < hidden_size / 32; b += 32)
    E4m3BlockToBf16Row(codes, scales, b, fresh, order, dst);
}

// Block b (32 values) of request row `row`, one thread: 32 values in, 32 E4M3 codes and one
// scale out (and, with x_bf or bf16_also, the block's BF16 values in `order`: in x_bf's row and
// at bf16_also, 64 bytes); an FP8 request block is copied as it is.
__device__ __forceinline__ void QuantizeBlock(const void* hidden, const uint8_t* hidden_scales,
                                              int in_dtype, int hidden_size, int row, int b,
                                              uint8_t* x_q, uint8_t* x_s, uint16_t* x_bf, int order,
                                              uint16_t* bf16_also = nullptr) {
  const int blocks = hidden_size / 32;
  const int64_t row_offset = static_cast<int64_t>(row) * hidden_size;
  uint8_t* q_row = x_q + row_offset;
  uint8_t* s_row = x_s + static_cast<int64_t>(row) * blocks;
  if (in_dtype == kInFP8) {
    const uint8_t* src = static_cast<const uint8_t*>(hidden) + row_offset + b * 32;
    uint4* dst = reinterpret_cast<uint4*>(q_row + b * 32);
    dst[0] = reinterpret_cast<const uint4*>(src)[0];
    dst[1] = reinterpret_cast<const uint4*>(src)[1];
    s_row[b] = hidden_scales[static_cast<int64_t>(row) * blocks + b];
    if (x_bf != nullptr || bf16_also != nullptr) {
      uint4 lo, hi;
      uint32_t scale_word;
      LoadE4m3Block(static_cast<const uint8_t*>(hidden) + row_offset,
                    hidden_scales + static_cast<int64_t>(row) * blocks, b, false, &lo, &hi,
                    &scale_word);
      const uint32_t codes[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      StoreBf16Block(codes, (scale_word >> (8 * (b % 4))) & 0xFFu, order,
                     x_bf != nullptr ? x_bf + row_offset + b * 32 : nullptr, bf16_also);
    }
    return;
  }
  float v[32];
  if (in_dtype == kInFP32) {
    const float4* src =
        reinterpret_cast<const float4*>(static_cast<const float*>(hidden) + row_offset + b * 32);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4 f = src[i];
      v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
    }
  } else {
    const uint4* src =
        reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(hidden) + row_offset + b * 32);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 u = src[i];
      const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t lo = words[j] & 0xFFFFu;
        const uint32_t hi = words[j] >> 16;
        if (in_dtype == kInBF16) {
          v[8 * i + 2 * j] = Bf16ToFloat(lo);
          v[8 * i + 2 * j + 1] = Bf16ToFloat(hi);
        } else {
          v[8 * i + 2 * j] = __half2float(__ushort_as_half(static_cast<unsigned short>(lo)));
          v[8 * i + 2 * j + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(hi)));
        }
      }
    }
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(v[i]));
  const uint32_t code = E4m3BlockScaleCode(amax);
  const float inverse = InverseScale(code);
  uint32_t packed[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    packed[i] = EncodeE4m3(__fmul_rn(v[4 * i], inverse)) |
                (EncodeE4m3(__fmul_rn(v[4 * i + 1], inverse)) << 8) |
                (EncodeE4m3(__fmul_rn(v[4 * i + 2], inverse)) << 16) |
                (EncodeE4m3(__fmul_rn(v[4 * i + 3], inverse)) << 24);
  }
  uint4* dst = reinterpret_cast<uint4*>(q_row + b * 32);
  dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  s_row[b] = static_cast<uint8_t>(code);
  if (x_bf != nullptr || bf16_also != nullptr) {
    StoreBf16Block(packed, code, order, x_bf != nullptr ? x_bf + row_offset + b * 32 : nullptr,
                   bf16_also);
  }
}

// Lane `lane` converts blocks lane, lane + 32, ... of row `row` (QuantizeBlock).
__device__ __forceinline__ void QuantizeRowWarp(const void* hidden, const uint8_t* hidden_scales,
                                                int in_dtype, int hidden_size, int row, int lane,
                                                uint8_t* x_q, uint8_t* x_s, uint16_t* x_bf,
                                                int order) {
  for (int b = lane; b < hidden_size / 32; b += 32) {
    QuantizeBlock(hidden, hidden_scales, in_dtype, hidden_size, row, b, x_q, x_s, x_bf, order);
  }
}

}  // namespace gcmoe::kernels
