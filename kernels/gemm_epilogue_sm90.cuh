// The two epilogues of a role2 task (DESIGN.md §4 steps 3-4), shared by both sm90 grouped-GEMM
// kernels. Each reads the task's tile results, rounded to BF16, through `red(row, token)` (row
// 0..63 of the 64-row weight tile) after a barrier that made them visible; warps 0..kWarps-1 of
// the calling threads take the tokens in passes.
#pragma once

#include <cstdint>

#include "kernels/bf16_operands.h"
#include "kernels/device_common.cuh"

namespace gcmoe::kernels {

// The warps' token passes. Per-token work (the routing metadata, the block scale, the address)
// is the same for every lane that works on the token, so a pass may give a warp several tokens
// at once, and each lane's metadata is loaded once per 32 lanes' worth of passes and handed to
// the lanes that use it by shuffle, instead of one dependent global load per token and pass.
inline constexpr uint32_t kFullWarp = 0xFFFFFFFFu;

// W1 (steps 3 and 4a) with kTokens tokens per pass and warp: 32 / kTokens lanes per token, each
// with kTokens adjacent features (kTokens (lane % (32 / kTokens)) ..), so that the block's amax
// is a reduction over those lanes and the lane's codes are one store per feature pair.
template <int kTokens, int kWarps, bool kExtended, typename RedAt>
__device__ __forceinline__ void SwigluPasses(const LayerParams& p, RedAt red, int rows, int tile,
                                             int inter, const RowMeta* meta, uint8_t* h_q) {
  constexpr int kLanes = 32 / kTokens;           // per token
  constexpr int kPreload = 32 / kTokens;         // passes whose weights one load covers
  const int warp = (threadIdx.x >> 5) % kWarps;  // within the calling warpgroup(s)
  const int lane = threadIdx.x & 31;
  const int group = lane / kLanes;           // the pass's token: first + group
  const int f0 = kTokens * (lane % kLanes);  // the lane's features f0 .. f0 + kTokens - 1
  const int stride = kTokens * kWarps;       // tokens per pass of all warps
  float weights = 1.0f;  // lane l: the routing weight of token l % kTokens of pass l / kTokens
  for (int pass = 0, first = kTokens * warp; first < rows; ++pass, first += stride) {
    if (meta != nullptr && pass % kPreload == 0) {
      const int m = first + stride * (lane / kTokens) + lane % kTokens;
      weights = m < rows ? __ldcg(&meta[m].weight) : 0.0f;
    }
    const int n = first + group;
    const int n_read = n < rows ? n : rows - 1;  // a token past the block: its lanes store nothing
    float h[kTokens];
#pragma unroll
    for (int i = 0; i < kTokens; ++i) {
      float gate = red(f0 + i, n_read);
      float up = red(32 + f0 + i, n_read);
      if (p.dims.has_clamp) {
        gate = fminf(gate, p.dims.clamp);
        up = fmaxf(fminf(up, p.dims.clamp), -p.dims.clamp);
      }
      if constexpr (kExtended) up = __fadd_rn(up, p.dims.up_offset);  // gpt-oss: u' + 1
      // Rounded operations, never contracted, in the CPU's order.
      const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(p.dims.alpha, gate))));
      h[i] = __fmul_rn(__fmul_rn(gate, sig), up);
    }
    // The weight last: its shuffle waits for the load, which the products above run under.
    const float weight = meta != nullptr
                             ? __shfl_sync(kFullWarp, weights, kTokens * (pass % kPreload) + group)
                             : 1.0f;
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kTokens; ++i) {
      h[i] = __fmul_rn(h[i], weight);
      amax = fmaxf(amax, fabsf(h[i]));
    }
#pragma unroll
    for (int o = kLanes / 2; o > 0; o >>= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(kFullWarp, amax, o));
    }
    const uint32_t code = E4m3BlockScaleCode(amax);
    const float inverse = InverseScale(code);
    uint32_t e4m3 = 0;  // the lane's codes, feature f0 + i in byte i
    if constexpr (kTokens == 1) {
      e4m3 = EncodeE4m3(__fmul_rn(h[0], inverse));
    } else {
#pragma unroll
      for (int i = 0; i < kTokens; i += 2) {
        e4m3 |= EncodeE4m3x2(__fmul_rn(h[i], inverse), __fmul_rn(h[i + 1], inverse)) << (8 * i);
      }
    }
    if (n >= rows) continue;
    uint16_t* row = reinterpret_cast<uint16_t*>(h_q) + static_cast<int64_t>(n) * inter + tile * 32;
    const uint32_t scale = Bf16PowerPair(code);
#pragma unroll
    for (int j = 0; j < (kTokens + 1) / 2; ++j) {
      const uint32_t pair = MulBf16x2(MulBf16x2(E4m3PairToBf16(e4m3, j), kE4m3Bf16Undo), scale);
      uint16_t* at = row + Bf16BlockColumn(f0 + 2 * j, p.act_bf16);
      if constexpr (kTokens == 1) {
        *at = static_cast<uint16_t>(pair);
      } else {  // features f0 + 2j and f0 + 2j + 1: adjacent in both orders
        *reinterpret_cast<uint32_t*>(at) = pair;
      }
    }
  }
}

// The role2 instances with the extended epilogue (kExtended: LayerDims::ExtendedEpilogue) add
// the expert biases and the up offset; the others have neither in their code, so a model
// without them pays nothing for them (registers included).
//
// The 64 bias values of tile `tile` of a routed task (StepHeader::b1 in W1's tile row order, I/32
// tiles an expert; b2, H an expert), or null for a shared task or a layer without biases. Read
// after the task's K loop: nothing of it stays live through the loop.
__device__ __forceinline__ const float* TileBias(const LayerParams& p, int kind, int block,
                                                 int tile) {
  const StepHeader& hdr = *p.header;
  const float* base = kind == kRoutedW1 ? hdr.b1 : kind == kRoutedW2 ? hdr.b2 : nullptr;
  if (base == nullptr) return nullptr;
  const int64_t per_expert = kind == kRoutedW1 ? 2 * p.dims.intermediate : p.dims.hidden;
  return base + p.blocks[block].local_slot * per_expert + tile * kTileRows;
}

// Steps 2 and 4b's biases, on one tile's FP32 results before their BF16 rounding, in the
// accumulator layout both kernels share (mma.sync m16n8 and wgmma m64nN): acc[4j + 2h + e] is
// tile row `row0` + 8h (row0 = 16 warp + g), token 8j + 2t + e. bias: the tile's 64 values.
// W1 (kWeighted false, meta unused): a = W1 x + b1. W2: p = W2 h + w b2, with the routing weight
// w of each token (meta, `rows` valid; the model's w (W2 h + b2), as h already carries w), w b2
// rounded first.
// W1 and W2 are two instances, and meta is never null. With one instance and a null meta for W1
// (`kind == W2 ? meta : null`, tested in this function), the BM 64 kernel with merged tails
// faulted in 1 run of 4 to 6 on H100 and H200: compute-sanitizer showed one warp loading
// meta[n].weight through a null pointer, though ptxas 13.0's code tests the pointer just before
// the load. This way the test of that case passed 189 runs of 189.
template <int kCols, bool kWeighted>
__device__ __forceinline__ void AddTileBias(float* acc, const float* bias, int row0,
                                            const RowMeta* meta, int rows) {
  const int t = threadIdx.x & 3;
  const float b[2] = {__ldg(&bias[row0]), __ldg(&bias[row0 + 8])};
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int n = 8 * j + 2 * t + e;
      // A column past the valid rows is never stored; its weight is not read.
      float w = 1.0f;
      if constexpr (kWeighted) w = n < rows ? __ldcg(&meta[n].weight) : 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float add = kWeighted ? __fmul_rn(w, b[h]) : b[h];
        acc[4 * j + 2 * h + e] = __fadd_rn(acc[4 * j + 2 * h + e], add);
      }
    }
  }
}

// W1 (steps 3 and 4a): a = BF16(W1 x + b1); h = ((g' sigmoid(alpha g')) (u' + o)) w; E4M3 per
// 32 features.
// Tile rows 0..31 are the gate features, 32..63 the matching up features
// (weight_tiles_sm90.h): one scale block of h. A warp's pass takes four tokens where the block
// gives every warp at least one such pass, else two or one, so that a small block still spreads
// over the warps (four at every size was 1-4 % slower at 2-32 tokens per rank; one token a pass
// about 5 % slower at 64 tokens per expert).
// The quantized h is stored as role2's W2 reads it (LayerParams::act_bf16): the exact BF16 of
// code x scale, in block column order (bf16_operands.h), 2 bytes per feature and no scale array.
// Every value is computed by the same rounded operations as the CPU backend's.
template <int kWarps, bool kExtended, typename RedAt>
__device__ __forceinline__ void SwigluEpilogue(const LayerParams& p, RedAt red, int rows, int tile,
                                               int inter, const RowMeta* meta, uint8_t* h_q) {
  if (rows >= 4 * kWarps) {
    SwigluPasses<4, kWarps, kExtended>(p, red, rows, tile, inter, meta, h_q);
  } else if (rows >= 2 * kWarps) {
    SwigluPasses<2, kWarps, kExtended>(p, red, rows, tile, inter, meta, h_q);
  } else {
    SwigluPasses<1, kWarps, kExtended>(p, red, rows, tile, inter, meta, h_q);
  }
}

// W2 (step 4b): BF16 partials of the tile's 64 hidden features, two per lane, written straight
// to the source rank's combine buffer at (token, slot): role3 only reduces. A pass is one token a
// warp; lane l computes the destination row of pass l (of each 32) once, from its metadata.
template <int kWarps, typename RedAt>
__device__ __forceinline__ void ScatterEpilogue(const LayerParams& p, RedAt red, int rows, int tile,
                                                const RowMeta* meta, int shared_first_token) {
  const int warp = (threadIdx.x >> 5) % kWarps;  // within the calling warpgroup(s)
  const int lane = threadIdx.x & 31;
  const int H = p.dims.hidden;
  const int k = p.dims.top_k;
  uint16_t* rows_at = nullptr;  // lane l: the destination of pass l of the current 32
  for (int pass = 0, n = warp; n < rows; ++pass, n += kWarps) {
    const int m = n + kWarps * lane;  // at pass % 32 == 0: lane l's pass
    uint4 mm = make_uint4(0, 0, 0, 0);
    if (pass % 32 == 0 && meta != nullptr && m < rows) mm = LdCg128(&meta[m]);
    const float v0 = red(2 * lane, n);  // read while the metadata loads
    const float v1 = red(2 * lane + 1, n);
    if (pass % 32 == 0 && m < rows) {
      const bool routed = meta != nullptr;
      const int token = routed ? static_cast<int>(mm.x) : shared_first_token + m;
      const int slot = routed ? static_cast<int>(mm.y) : k;
      const int src = routed ? static_cast<int>(mm.z) : p.dims.rank;
      rows_at = p.peers.combine[src] + (static_cast<int64_t>(token) * (k + 1) + slot) * H +
                tile * kTileRows;
    }
    uint16_t* dst = reinterpret_cast<uint16_t*>(
        __shfl_sync(kFullWarp, reinterpret_cast<uintptr_t>(rows_at), pass % 32));
    *reinterpret_cast<uint32_t*>(dst + 2 * lane) = Bf16Bits(v0) | (Bf16Bits(v1) << 16);
  }
}

}  // namespace gcmoe::kernels
