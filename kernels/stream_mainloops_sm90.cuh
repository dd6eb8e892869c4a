// The consumer warpgroup's K loops of the warp-specialized role2
// (grouped_gemm_wgmma_fp8_fp4_sm90.cu), one chunk (K128) per stage of its pipeline
// (stream_pipeline_sm90.cuh): mma.sync or FP8 wgmma with the block scales folded in per K32
// (Mainloop), or exact BF16 operands and mma.sync over the whole K (MainloopBf16); RunMainloop
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

// The bf16 variant's MMA: one warp's m16n8k16 BF16, accumulating into d (FP32).
__device__ __forceinline__ void MmaBf16(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float& d0,
                                        float& d1, float& d2, float& d3) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
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
    // The stage's loads inline: a shared load helper cost this kernel 1-2 % (measured).
    MbarWait(SmemAddr(&bars.full[s]), ring.phase, mbar_timeout, env, s);
    const uint8_t* st = stage_base + static_cast<int64_t>(s) * stage_bytes;
    const uint8_t* a_src = st + warp * kChunk;  // warp w: stripe w (tile rows 16w..16w+15)
    uint32_t w[kPieces * 4];
    LoadLaneWords<kPieces>(a_src, lane, w);
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

// The bf16 kernel's K loop (GemmKernel::kStreamBf16), one chunk per stage: exact BF16 operands
// and mma.sync m16n8k16 BF16 accumulating the whole K in FP32. No per-K32 scale folding, no
// E4M3 conversions (sm_90 runs E4M3 mma.sync on the FP16 tensor cores, converting every operand),
// none of the FP8 tensor core's reduced-precision sums.
//   A: the weights decoded to BF16 times 2^-126 by masks and rotations (kE2M1Bf16 lane words) and
//      multiplied by their block scale times 2^126 (exact), per K32 block the registers of its two
//      K16 steps (the lane word's low and high runs). With kTiles = 2 (Role2TilesPerTask) the
//      warp holds stripe w of both tiles of the task and every B load feeds both.
//   B: the block's activations as exact BF16 rows written once per block (role1's pull, the W1
//      epilogue), in block column order (bf16_operands.h): lane t's eight values of a 32-block
//      are one 16-byte unit, the b0, b1 of both K16 steps, so one shared load per token group
//      and K32 block. The stage holds [kb][token][t][16 bytes].
// At N <= 16 the two K16 steps of a block accumulate into separate tiles (summed at the end): a
// single chain of dependent mma.sync would bound a warp by the MMA latency.
template <int BM, int N, bool kFp4, int kTiles>
__device__ __forceinline__ void MainloopBf16(const TaskDesc& d, const uint8_t* stage_base,
                                             int stages, int stage_bytes, int a_region,
                                             Barriers& bars, uint64_t mbar_timeout,
                                             const WaitEnv& env, float (&acc)[kTiles * BM / 2],
                                             RingCursor& ring, bool hold_last) {
  constexpr TileFormat kFormat = kFp4 ? TileFormat::kE2M1Bf16 : TileFormat::kE4M3;
  constexpr uint32_t kBias = kFp4 ? kE2m1Bf16ScaleBias : kE4m3Bf16ScaleBias;
  constexpr int kPayload = ChunkPayloadBytes(kFormat);
  constexpr int kWords = kPayload / 128;
  constexpr bool kSplit = N <= 16;
  constexpr int kHi = kSplit ? kTiles * N / 2 : 1;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int unit = (lane >> 2) * 64 + (lane & 3) * 16;  // token g's unit t of a block
  const int a_tile_region = a_region / kTiles;
  const int chunks = d.k / kChunkK;
  float acc_hi[kHi];
#pragma unroll
  for (int i = 0; i < kHi; ++i) acc_hi[i] = 0.0f;

  for (int c = 0; c < chunks; ++c, ring.Advance(stages)) {
    const int s = ring.stage;
    MbarWait(SmemAddr(&bars.full[s]), ring.phase, mbar_timeout, env, s);
    const uint8_t* st = stage_base + static_cast<int64_t>(s) * stage_bytes;
    // This lane's words of stripe `warp` of each tile (weight_tiles_sm90.h), and its scale codes
    // plus the multipliers' bias (every code is in range: the load shifts them, scale_shift).
    uint32_t w[kTiles][kWords];
    uint2 sw[kTiles];
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) {
      const uint8_t* a_src = st + tile * a_tile_region + warp * ChunkBytes(kFormat);
      // LoadLaneWords' loop, written out: through the helper this default kernel's PTX address
      // arithmetic changes (a 2026-12-02 PTX comparison), which no GPU run has measured.
#pragma unroll
      for (int q = 0; q < kPayload / 512; ++q) {
        const uint4 v = *reinterpret_cast<const uint4*>(a_src + q * 512 + lane * 16);
        w[tile][q * 4 + 0] = v.x;
        w[tile][q * 4 + 1] = v.y;
        w[tile][q * 4 + 2] = v.z;
        w[tile][q * 4 + 3] = v.w;
      }
      const uint2 codes = *reinterpret_cast<const uint2*>(a_src + kPayload + (lane >> 2) * 8);
      sw[tile] = make_uint2(BiasScaleBytes(codes.x, kBias), BiasScaleBytes(codes.y, kBias));
    }
    const uint8_t* b_st = st + a_region + unit;
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      // Registers of K16 step 2kb + h: rows g and g + 8 at columns 2t, 2t + 1 (a[.][h][0],
      // a[.][h][1]) and 2t + 8, 2t + 9 (a[.][h][2], a[.][h][3]).
      uint32_t a[kTiles][2][4];
#pragma unroll
      for (int tile = 0; tile < kTiles; ++tile) {
        DecodeBlockFragments<kFp4>(&w[tile][kFp4 ? kb * 2 : kb * 4],
                                   kb < 2 ? sw[tile].x : sw[tile].y, kb, a[tile]);
      }
#pragma unroll
      for (int j = 0; j < N / 8; ++j) {
        const uint4 b = *reinterpret_cast<const uint4*>(b_st + (kb * BM + 8 * j) * 64);
#pragma unroll
        for (int tile = 0; tile < kTiles; ++tile) {
          float* lo = &acc[tile * BM / 2 + 4 * j];
          MmaBf16(a[tile][0], b.x, b.y, lo[0], lo[1], lo[2], lo[3]);
          float* hi = kSplit ? &acc_hi[tile * N / 2 + 4 * j] : lo;
          MmaBf16(a[tile][1], b.z, b.w, hi[0], hi[1], hi[2], hi[3]);
        }
      }
    }
    // The last chunk's stage, held, takes the task's results (RedInStage): the caller releases it.
    if (!hold_last || c + 1 < chunks) {
      FenceProxyAsyncShared();  // behind this thread's generic loads of the stage (the refill)
      MbarArrive(SmemAddr(&bars.empty[s]));
    }
  }
  if constexpr (kSplit) {
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) {
#pragma unroll
      for (int i = 0; i < N / 2; ++i) acc[tile * BM / 2 + i] += acc_hi[tile * N / 2 + i];
    }
  }
}

template <int BM, bool kFp4, GemmKernel kKernel>
__device__ __forceinline__ void RunMainloop(const TaskDesc& d, const uint8_t* stage_base,
                                            int stages, int stage_bytes, int a_region,
                                            Barriers& bars, uint64_t mbar_timeout,
                                            const WaitEnv& env,
                                            float (&acc)[Role2TilesPerTask(kKernel, BM) * BM / 2],
                                            RingCursor& ring, bool w2, bool hold_last) {
#define GCMOE_MAINLOOP(N)                                                                         \
  if constexpr (kKernel == GemmKernel::kStreamBf16) {                                             \
    MainloopBf16<BM, N, kFp4, Role2TilesPerTask(kKernel, BM)>(d, stage_base, stages, stage_bytes, \
                                                              a_region, bars, mbar_timeout, env,  \
                                                              acc, ring, hold_last);              \
  } else if constexpr (kKernel == GemmKernel::kStreamMma && BM <= 32) {                           \
    /* W2 on FP8 wgmma (GemmKernel::kStreamMma). Not at BM 64: its spills (168 registers). */     \
    if (w2) {                                                                                     \
      Mainloop<BM, N, kFp4, true>(d, stage_base, stages, stage_bytes, a_region, bars,             \
                                  mbar_timeout, env, acc, ring);                                  \
    } else {                                                                                      \
      Mainloop<BM, N, kFp4, false>(d, stage_base, stages, stage_bytes, a_region, bars,            \
                                   mbar_timeout, env, acc, ring);                                 \
    }                                                                                             \
  } else {                                                                                        \
    Mainloop<BM, N, kFp4, kKernel == GemmKernel::kStreamWgmma>(                                   \
        d, stage_base, stages, stage_bytes, a_region, bars, mbar_timeout, env, acc, ring);        \
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
