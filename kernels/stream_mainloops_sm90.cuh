// The consumer warpgroup's K loop of role2 at BM 8, 16 and 32 (grouped_gemm_sm90.cu), one chunk
// (K128) per stage of its pipeline (stream_pipeline_sm90.cuh): exact BF16 operands and mma.sync
// over the whole K (MainloopBf16); RunMainloop picks its MMA width per task.
#pragma once

#include <cstdint>

#include "kernels/bf16_operands.h"
#include "kernels/device_common.cuh"
#include "kernels/scale_bytes.h"
#include "kernels/sm90_async.cuh"
#include "kernels/stream_pipeline_sm90.cuh"
#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::kernels::stream_role2 {

// One warp's mma.sync m16n8k16 BF16, accumulating into d (FP32).
__device__ __forceinline__ void MmaBf16(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float& d0,
                                        float& d1, float& d2, float& d3) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The task's K loop, one chunk (K128) per stage: exact BF16 operands and mma.sync m16n8k16 BF16
// accumulating the whole K in FP32. No per-K32 scale folding, no E4M3 operand conversions (sm_90
// runs E4M3 mma.sync on the FP16 tensor cores, converting every operand), none of the FP8 tensor
// core's reduced-precision sums.
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
      // LoadLaneWords' loop, written out: through the helper the kernel's PTX address arithmetic
      // changes.
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

// The K loop at the smallest MMA width covering the task's rows (TaskDesc::n).
template <int BM, bool kFp4>
__device__ __forceinline__ void RunMainloop(const TaskDesc& d, const uint8_t* stage_base,
                                            int stages, int stage_bytes, int a_region,
                                            Barriers& bars, uint64_t mbar_timeout,
                                            const WaitEnv& env,
                                            float (&acc)[Role2TilesPerTask(BM) * BM / 2],
                                            RingCursor& ring, bool hold_last) {
#define GCMOE_MAINLOOP(N)                                                                         \
  MainloopBf16<BM, N, kFp4, Role2TilesPerTask(BM)>(d, stage_base, stages, stage_bytes, a_region, \
                                                   bars, mbar_timeout, env, acc, ring, hold_last)
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
