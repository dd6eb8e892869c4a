// The two epilogues of a role2 task (DESIGN.md §4 steps 3-4), shared by both sm90 grouped-GEMM
// kernels. Each reads the task's FP32 tile results through `red(row, token)` (row 0..63 of the
// 64-row weight tile) after a barrier that made them visible, with warps 0..kWarps-1 of the
// calling threads taking one token each in turn.
#pragma once

#include <cstdint>

#include "kernels/bf16_operands.h"
#include "kernels/device_common.cuh"

namespace gcmoe::kernels {

// W1 (steps 3 and 4a): a = BF16(W1 x); h = ((g' sigmoid(a g')) u') w; E4M3 per 32 features.
// Warp per token, lane per feature: the warp's 32 lanes are one scale block of h. Tile rows
// 0..31 are the gate features, 32..63 the matching up features (weight_tiles_sm90.h). With
// kBf16Out (the bf16 role2, LayerParams::act_bf16) the quantized h is stored as that kernel
// reads it: the exact BF16 of code x scale, in block column order (bf16_operands.h), 2 bytes
// per feature and no scale array.
template <int kWarps, bool kBf16Out = false, typename RedAt>
__device__ __forceinline__ void SwigluEpilogue(const LayerParams& p, RedAt red, int rows, int tile,
                                               int inter, const RowMeta* meta, uint8_t* h_q,
                                               uint8_t* h_s) {
  const int warp = (threadIdx.x >> 5) % kWarps;  // within the calling warpgroup(s)
  const int lane = threadIdx.x & 31;
  for (int n = warp; n < rows; n += kWarps) {
    float gate = RoundBf16(red(lane, n));
    float up = RoundBf16(red(32 + lane, n));
    if (p.dims.has_clamp) {
      gate = fminf(gate, p.dims.clamp);
      up = fmaxf(fminf(up, p.dims.clamp), -p.dims.clamp);
    }
    const float weight = meta != nullptr ? __ldcg(&meta[n].weight) : 1.0f;
    // Rounded operations, never contracted, in the CPU's order.
    const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(p.dims.alpha, gate))));
    const float h = __fmul_rn(__fmul_rn(__fmul_rn(gate, sig), up), weight);
    float amax = fabsf(h);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    const uint32_t code = E4m3BlockScaleCode(amax);
    const uint32_t e4m3 = EncodeE4m3(__fmul_rn(h, InverseScale(code)));
    if constexpr (kBf16Out) {
      const uint32_t value =
          MulBf16x2(MulBf16x2(E4m3PairToBf16(e4m3, 0), kE4m3Bf16Undo), Bf16PowerPair(code));
      reinterpret_cast<uint16_t*>(
          h_q)[static_cast<int64_t>(n) * inter + tile * 32 + Bf16BlockColumn(lane, p.act_bf16)] =
          static_cast<uint16_t>(value);
    } else {
      h_q[static_cast<int64_t>(n) * inter + tile * 32 + lane] = static_cast<uint8_t>(e4m3);
      if (lane == 0) {
        h_s[static_cast<int64_t>(n) * (inter / 32) + tile] = static_cast<uint8_t>(code);
      }
    }
  }
}

// W2 (step 4b): BF16 partials of the tile's 64 hidden features, two per lane, written straight
// to the source rank's combine buffer at (token, slot): role3 only reduces.
template <int kWarps, typename RedAt>
__device__ __forceinline__ void ScatterEpilogue(const LayerParams& p, RedAt red, int rows, int tile,
                                                const RowMeta* meta, int shared_first_token) {
  const int warp = (threadIdx.x >> 5) % kWarps;  // within the calling warpgroup(s)
  const int lane = threadIdx.x & 31;
  const int H = p.dims.hidden;
  const int k = p.dims.top_k;
  for (int n = warp; n < rows; n += kWarps) {
    int token, slot, src;
    if (meta != nullptr) {
      const uint4 m = LdCg128(&meta[n]);
      token = static_cast<int>(m.x);
      slot = static_cast<int>(m.y);
      src = static_cast<int>(m.z);
    } else {
      token = shared_first_token + n;
      slot = k;
      src = p.dims.rank;
    }
    const float v0 = red(2 * lane, n);
    const float v1 = red(2 * lane + 1, n);
    uint16_t* dst = p.peers.combine[src] + (static_cast<int64_t>(token) * (k + 1) + slot) * H +
                    tile * kTileRows + 2 * lane;
    *reinterpret_cast<uint32_t*>(dst) = Bf16Bits(v0) | (Bf16Bits(v1) << 16);
  }
}

}  // namespace gcmoe::kernels
