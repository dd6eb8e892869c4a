// The consumer warpgroup's K loops of the warp-specialized role2
// (grouped_gemm_wgmma_fp8_fp4_sm90.cu), one chunk (K128) per stage of its pipeline
// (stream_pipeline_sm90.cuh): mma.sync or FP8 wgmma with the block scales folded in per K32
// (Mainloop), or exact BF16 operands and wgmma over the whole K (MainloopBf16); RunMainloop
// picks one per task.
#pragma once

#include <cstdint>

#include "kernels/bf16_operands.h"
#include "kernels/device_common.cuh"
#include "kernels/scale_bytes.h"
#include "kernels/sm90_async.cuh"
#include "kernels/stream_pipeline_sm90.cuh"
#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::kernels::stream_role2 {

// The mma.sync variant's MMA (GCMOE_CUDA_GEMM=stream): one warp's m16n8k32 of the same tile.
__device__ __forceinline__ void MmaE4m3(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1, float& d0, float& d1, float& d2,
                                        float& d3) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};"
      : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

// acc[4j..4j+3] += tile (this warp's rows g, g+8; tokens 8j+2t, 8j+2t+1) of scale block kb,
// times the weight and activation block scales. Products of powers of two are exact, so this
// is the sum of exactly scaled products, in another order than the CPU's.
template <int N, int BM>
__device__ __forceinline__ void FoldScaled(float (&acc)[BM / 2], const float* tile, uint2 sw,
                                           const uint32_t (&sx)[N / 8][2], int kb) {
  const uint32_t sw_word = kb < 2 ? sw.x : sw.y;
  const float scale_g = WeightScale(sw_word, (kb & 1) * 2);
  const float scale_g8 = WeightScale(sw_word, (kb & 1) * 2 + 1);
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    const float sx0 = ActivationScale(sx[j][0], kb);
    const float sx1 = ActivationScale(sx[j][1], kb);
    acc[4 * j + 0] = fmaf(tile[4 * j + 0], scale_g * sx0, acc[4 * j + 0]);
    acc[4 * j + 1] = fmaf(tile[4 * j + 1], scale_g * sx1, acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(tile[4 * j + 2], scale_g8 * sx0, acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(tile[4 * j + 3], scale_g8 * sx1, acc[4 * j + 3]);
  }
}

// Waits until stage s is full, then loads this lane's weight words of its warp's stripe (warp w:
// tile rows 16w..16w+15), kPayload / 512 pieces of 16 bytes, and the 8 scale bytes of its rows
// g and g + 8. Returns the stage.
template <TileFormat kFormat>
__device__ __forceinline__ const uint8_t* WaitAndLoadWeights(
    const uint8_t* stage_base, int stage_bytes, int s, uint32_t phase, Barriers& bars,
    uint64_t mbar_timeout, const WaitEnv& env, uint32_t (&w)[ChunkPayloadBytes(kFormat) / 128],
    uint2& scales) {
  constexpr int kPayload = ChunkPayloadBytes(kFormat);
  const int lane = threadIdx.x & 31;
  MbarWait(SmemAddr(&bars.full[s]), phase, mbar_timeout, env, s);
  const uint8_t* st = stage_base + static_cast<int64_t>(s) * stage_bytes;
  const uint8_t* a_src = st + (threadIdx.x >> 5) * ChunkBytes(kFormat);
#pragma unroll
  for (int q = 0; q < kPayload / 512; ++q) {
    const uint4 v = *reinterpret_cast<const uint4*>(a_src + q * 512 + lane * 16);
    w[q * 4 + 0] = v.x;
    w[q * 4 + 1] = v.y;
    w[q * 4 + 2] = v.z;
    w[q * 4 + 3] = v.w;
  }
  scales = *reinterpret_cast<const uint2*>(a_src + kPayload + (lane >> 2) * 8);
  return st;
}

// The task's K loop: one chunk (K128 = four scale blocks) per stage.
template <int BM, int N, bool kFp4, bool kWgmma>
__device__ __forceinline__ void Mainloop(const TaskDesc& d, const uint8_t* stage_base, int stages,
                                         int stage_bytes, int a_region, Barriers& bars,
                                         uint64_t mbar_timeout, const WaitEnv& env,
                                         float (&acc)[BM / 2], RingCursor& ring) {
  constexpr TileFormat kFormat = kFp4 ? TileFormat::kE2M1 : TileFormat::kE4M3;
  constexpr int kPayload = ChunkPayloadBytes(kFormat);
  constexpr int kPieces = kPayload / 512;
  constexpr int kChunk = ChunkBytes(kFormat);
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int chunks = d.k / kChunkK;
  const int scale_row = d.k / 32;
  float tile0[N / 2];
  float tile1[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) tile0[i] = tile1[i] = 0.0f;

  for (int c = 0; c < chunks; ++c, ring.Advance(stages)) {
    const int s = ring.stage;
    // Inline, not WaitAndLoadWeights: with the call this kernel ran 1-2 % slower (measured).
    MbarWait(SmemAddr(&bars.full[s]), ring.phase, mbar_timeout, env, s);
    const uint8_t* st = stage_base + static_cast<int64_t>(s) * stage_bytes;
    const uint8_t* a_src = st + warp * kChunk;  // warp w: stripe w (tile rows 16w..16w+15)
    uint32_t w[kPieces * 4];
#pragma unroll
    for (int q = 0; q < kPieces; ++q) {
      const uint4 v = *reinterpret_cast<const uint4*>(a_src + q * 512 + lane * 16);
      w[q * 4 + 0] = v.x;
      w[q * 4 + 1] = v.y;
      w[q * 4 + 2] = v.z;
      w[q * 4 + 3] = v.w;
    }
    const uint2 sw = *reinterpret_cast<const uint2*>(a_src + kPayload + g * 8);
    const uint8_t* b_st = st + a_region;
    const uint8_t* s_st = b_st + BM * kChunkK;
    uint32_t sx[N / 8][2];
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = 8 * j + 2 * t + h;
        const int off = (d.scale_mod + n * scale_row + c * 4) & 15;
        sx[j][h] = *reinterpret_cast<const uint32_t*>(s_st + n * 16 + off);
      }
    }

#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint32_t a[4];
      if constexpr (kFp4) {
        // E4M3 codes of the values times 2^-6 (weight_tiles_sm90.h): paid after the loop.
        const E4m3Pair row_g = DecodeE2m1Word(w[kb * 2]);
        const E4m3Pair row_g8 = DecodeE2m1Word(w[kb * 2 + 1]);
        a[0] = row_g.lo;
        a[2] = row_g.hi;
        a[1] = row_g8.lo;
        a[3] = row_g8.hi;
      } else {
        a[0] = w[kb * 4 + 0];
        a[2] = w[kb * 4 + 1];
        a[1] = w[kb * 4 + 2];
        a[3] = w[kb * 4 + 3];
      }
      if constexpr (kWgmma) {
        // Two FP32 tiles alternate: K32 block kb's wgmma runs while kb-1 is folded in.
        float(&cur)[N / 2] = (kb & 1) ? tile1 : tile0;
        float(&prev)[N / 2] = (kb & 1) ? tile0 : tile1;
#pragma unroll
        for (int i = 0; i < N / 2; ++i) FenceOperand(cur[i]);
        WgmmaFence();
        const uint32_t b_addr = SmemAddr(b_st) + static_cast<uint32_t>(2 * kb * BM * 16);
        WgmmaE4m3<N>::Run(cur, a, SmemDescNoSwizzle(b_addr, BM * 16, 128));
        WgmmaCommit();
        if (kb > 0) {
          WgmmaWait<1>();
#pragma unroll
          for (int i = 0; i < N / 2; ++i) FenceOperand(prev[i]);
          FoldScaled<N, BM>(acc, prev, sw, sx, kb - 1);
        }
      } else {
        // Same B bytes for mma.sync: b0 = logical K 4t.. (unit 2kb), b1 = 16+4t.. (unit 2kb+1).
#pragma unroll
        for (int j = 0; j < N / 8; ++j) {
          const uint8_t* b = b_st + (8 * j + g) * 16 + 4 * t;
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(b + (2 * kb) * (BM * 16));
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(b + (2 * kb + 1) * (BM * 16));
          MmaE4m3(a[0], a[1], a[2], a[3], b0, b1, tile0[4 * j], tile0[4 * j + 1], tile0[4 * j + 2],
                  tile0[4 * j + 3]);
        }
        FoldScaled<N, BM>(acc, tile0, sw, sx, kb);
      }
    }
    if constexpr (kWgmma) {
      WgmmaWait<0>();
#pragma unroll
      for (int i = 0; i < N / 2; ++i) FenceOperand(tile1[i]);
      FoldScaled<N, BM>(acc, tile1, sw, sx, 3);
    }
    // This thread is done with stage s. Its shared-memory reads are generic-proxy loads and
    // the refill writes the A region through the async proxy (the bulk copy), so a proxy fence
    // must order them. Without it ptxas issued the arrive while loads of the stage (the last
    // K32's B and the scales) were still in flight, and under load (two ranks, roles
    // overlapped) the refill overwrote data a warp had not read yet: one warp's stripe of a
    // tile came out wrong (docs/PERFORMANCE.md, "Multi-GPU"). The fence (MEMBAR.ALL.CTA +
    // FENCE.VIEW.ASYNC.S in SASS) waits for those loads; it cost nothing measurable.
    FenceProxyAsyncShared();
    MbarArrive(SmemAddr(&bars.empty[s]));
  }
  if constexpr (kFp4) {
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) acc[i] *= kE2m1DecodeScale;  // exact: a power of two
  }
}

// The bf16 kernel's K loop (GemmKernel::kStreamBf16), one chunk per stage. The stage's B is
// the block's activations as exact BF16 in the weights' column order (written once per block by
// role1 or the W1 epilogue); the weights are decoded to BF16 and multiplied by their block scale
// in registers (exact), all four K32 blocks first, then the stage's eight wgmma m64nNk16 BF16
// accumulate into the FP32 tile as one group (issuing per K32 block with one in flight measured
// 1-2 % slower). Exact operands and one FP32 accumulation over K: no per-K32 scale folding, none
// of the FP8 tensor core's reduced-precision sums. A stage goes back to the producer once the
// MMAs reading it are done, at its end: keeping them in flight into the next stage made ptxas
// serialize every wgmma (C7513: the next stage's descriptor is defined while an MMA that read
// the previous one runs).
template <int BM, int N, bool kFp4>
__device__ __forceinline__ void MainloopBf16(const TaskDesc& d, const uint8_t* stage_base,
                                             int stages, int stage_bytes, int a_region,
                                             Barriers& bars, uint64_t mbar_timeout,
                                             const WaitEnv& env, float (&acc)[BM / 2],
                                             RingCursor& ring) {
  constexpr TileFormat kFormat = kFp4 ? TileFormat::kE2M1Bf16 : TileFormat::kE4M3;
  constexpr uint32_t kBias = kFp4 ? kE2m1Bf16ScaleBias : kE4m3Bf16ScaleBias;
  const int chunks = d.k / kChunkK;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) FenceOperand(acc[i]);

  for (int c = 0; c < chunks; ++c, ring.Advance(stages)) {
    const int s = ring.stage;
    uint32_t w[ChunkPayloadBytes(kFormat) / 128];
    uint2 sw;
    const uint8_t* st = WaitAndLoadWeights<kFormat>(stage_base, stage_bytes, s, ring.phase, bars,
                                                    mbar_timeout, env, w, sw);
    // K16 step j's B: units 2j and 2j + 1, BM * 16 bytes apart (the descriptor's K stride).
    const uint64_t b_desc = SmemDescNoSwizzle(SmemAddr(st + a_region), BM * 16, 128);

    // Registers {r0, r1, r2, r3} of K16 step 2kb + h: rows g and g + 8 at columns 2t, 2t + 1
    // (r0, r1) and 2t + 8, 2t + 9 (r2, r3); step 2kb holds K32 block kb's low run, 2kb + 1 its
    // high run. All eight steps are decoded first, then issued as one group.
    uint32_t a[8][4];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      const uint32_t sw_word = kb < 2 ? sw.x : sw.y;
      const uint32_t f_g = ScaleBytePair(sw_word, (kb & 1) * 2, kBias);
      const uint32_t f_g8 = ScaleBytePair(sw_word, (kb & 1) * 2 + 1, kBias);
      if constexpr (kFp4) {
        const Bf16Quad row_g = DecodeE2m1Bf16Word(w[kb * 2]);
        const Bf16Quad row_g8 = DecodeE2m1Bf16Word(w[kb * 2 + 1]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          a[2 * kb + h][0] = MulBf16x2(row_g.r[2 * h], f_g);
          a[2 * kb + h][1] = MulBf16x2(row_g8.r[2 * h], f_g8);
          a[2 * kb + h][2] = MulBf16x2(row_g.r[2 * h + 1], f_g);
          a[2 * kb + h][3] = MulBf16x2(row_g8.r[2 * h + 1], f_g8);
        }
      } else {
        // E4M3 words of the block: row g low run, row g high run, row g + 8 low, high.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          a[2 * kb + h][0] = MulBf16x2(E4m3PairToBf16(w[kb * 4 + h], 0), f_g);
          a[2 * kb + h][1] = MulBf16x2(E4m3PairToBf16(w[kb * 4 + 2 + h], 0), f_g8);
          a[2 * kb + h][2] = MulBf16x2(E4m3PairToBf16(w[kb * 4 + h], 1), f_g);
          a[2 * kb + h][3] = MulBf16x2(E4m3PairToBf16(w[kb * 4 + 2 + h], 1), f_g8);
        }
      }
    }
    WgmmaFence();
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      // The descriptor's address field counts 16-byte units.
      const uint64_t step = static_cast<uint64_t>(j * 2 * BM * 16) >> 4;
      WgmmaBf16<N>::Run(acc, a[j], b_desc + step, c > 0 || j > 0);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceProxyAsyncShared();  // behind this thread's generic loads of the stage
    MbarArrive(SmemAddr(&bars.empty[s]));
  }
#pragma unroll
  for (int i = 0; i < N / 2; ++i) FenceOperand(acc[i]);
}

template <int BM, bool kFp4, GemmKernel kKernel>
__device__ __forceinline__ void RunMainloop(const TaskDesc& d, const uint8_t* stage_base,
                                            int stages, int stage_bytes, int a_region,
                                            Barriers& bars, uint64_t mbar_timeout,
                                            const WaitEnv& env, float (&acc)[BM / 2],
                                            RingCursor& ring, bool w2) {
#define GCMOE_MAINLOOP(N)                                                                       \
  if constexpr (kKernel == GemmKernel::kStreamBf16) {                                           \
    MainloopBf16<BM, N, kFp4>(d, stage_base, stages, stage_bytes, a_region, bars, mbar_timeout, \
                              env, acc, ring);                                                  \
  } else if constexpr (kKernel == GemmKernel::kStreamMma && BM <= 32) {                         \
    /* W2 on FP8 wgmma (GemmKernel::kStreamMma). Not at BM 64: its spills (168 registers). */   \
    if (w2) {                                                                                   \
      Mainloop<BM, N, kFp4, true>(d, stage_base, stages, stage_bytes, a_region, bars,           \
                                  mbar_timeout, env, acc, ring);                                \
    } else {                                                                                    \
      Mainloop<BM, N, kFp4, false>(d, stage_base, stages, stage_bytes, a_region, bars,          \
                                   mbar_timeout, env, acc, ring);                               \
    }                                                                                           \
  } else {                                                                                      \
    Mainloop<BM, N, kFp4, kKernel == GemmKernel::kStreamWgmma>(                                 \
        d, stage_base, stages, stage_bytes, a_region, bars, mbar_timeout, env, acc, ring);      \
  }
  if (d.n <= 8) {
    GCMOE_MAINLOOP(8);
  } else if constexpr (BM >= 16) {
    if (d.n <= 16) {
      GCMOE_MAINLOOP(16);
    } else if constexpr (BM >= 32) {
      if (d.n <= 32) {
        GCMOE_MAINLOOP(32);
      } else if constexpr (BM >= 64) {
        GCMOE_MAINLOOP(64);
      }
    }
  }
#undef GCMOE_MAINLOOP
}

}  // namespace gcmoe::kernels::stream_role2
