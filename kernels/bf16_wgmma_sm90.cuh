// The bf16-wgmma role2 at BM 64 (GemmKernel::kWgmmaBf16; GroupedGemmWgmmaBf16Kernel in
// grouped_gemm_wgmma_fp8_fp4_sm90.cu): the paper's register-A wgmma (§4.4) on exact BF16
// operands. Weights decoded in the consumer warps' registers exactly as the bf16 kernel's
// mma.sync (DecodeWeightUnit: a warp's A registers of a K16 step are the per-warp A fragment
// of wgmma m64nNk16), tokens read by the tensor core from shared memory by descriptor, so one
// wgmma per K16 step multiplies a warpgroup's 64 weight rows with every valid token of the block
// while the SM's other warpgroups decode.
//
// CTA (three per SM, WideCtasPerSm) = two consumer warpgroups (warpgroup w computes tile w of the
// task's two tiles: its warp q holds rows 16q..16q+15, as the streaming kernels' consumer warp q) +
// one producer warp (the streaming kernels' Producer, kWide mode). A stage holds the block's BF16
// token rows first (1024-aligned, K-major with the 128-byte swizzle: [K half][row][128 bytes],
// one TMA box of 16 rows per K half and 16-row group of valid rows), then both tiles' chunks.
// full: 1 arrival, the producer's expect_tx of every byte (both copies are async-proxy writes,
// and wgmma reads through the async proxy: no proxy fence); empty: 256, every consumer thread
// once the wgmma of the stage's last K32 block completed, or for a task's last stage, which takes
// the task's results (BF16, both warpgroups' tiles), once its warpgroup's epilogue read them.
//
// The MMA width N is the valid rows rounded up to 16 (valid-M sizing); the columns past the
// valid rows multiply whatever the stage holds there and are never stored.
//
// The tokens' K order is the wgmma order (bf16_operands.h, kBf16WgmmaOrder): K16 step s of a
// block reads its 32 contiguous bytes 32 s.., whose column 2t + e must hold the logical position
// the A register of lane t holds (16 s + 4 t + e, and 16 s + 4 t + 2 + e at column 2t + 8 + e).
// The graph of this block size writes every BF16 row in that order (LayerParams::act_bf16).
#pragma once

#include <cstdint>

#include "kernels/bf16_operands.h"
#include "kernels/device_common.cuh"
#include "kernels/layer_roles.h"
#include "kernels/role2_probe.h"
#include "kernels/scale_bytes.h"
#include "kernels/sm90_async.cuh"
#include "kernels/stream_pipeline_sm90.cuh"
#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::kernels::stream_role2 {

inline constexpr int kWideBm = kWgmmaBf16Bm;
inline constexpr int kWideGroups = 2;  // consumer warpgroups, one per tile of the task
inline constexpr int kWideConsumers = kWideGroups * kConsumerThreads;
inline constexpr int kWideThreads = kWideConsumers + 32;
inline constexpr int kWideTokenHalfBytes = kWideBm * 128;
inline constexpr int kWideTokenBytes = 2 * kWideTokenHalfBytes;
// A warpgroup's results as BF16, red[weight row 0..63][token] (pitch in values, padded against
// conflicts), written over the stage of the task's last chunk once both warpgroups are done with
// it: exact, as both epilogues round each result to BF16 first (gemm_epilogue_sm90.cuh).
inline constexpr int kWideRedPitch = kWideBm + 8;
inline constexpr int kWideRedBytes = kWideGroups * kTileRows * kWideRedPitch * 2;

// A stage: the token rows, then the chunks of both tiles, padded to the swizzle atom.
__host__ __device__ constexpr int WideStageBytes(bool has_shared) {
  return (kWideTokenBytes + kWideGroups * ARegionBytes(has_shared) + 1023) / 1024 * 1024;
}
// Stages that fit `ctas` resident CTAs per SM (the results go over a stage; the 1024-byte
// alignment of the layout may cost up to 1023 bytes at the start).
__host__ __device__ constexpr int WideStagesAt(bool has_shared, int ctas) {
  return (kSmemPerSm / ctas - kSmemReservedPerCta - 1024 - static_cast<int>(sizeof(Barriers))) /
         WideStageBytes(has_shared);
}
// Three CTAs per SM (six warpgroups, each pair with its own ring and tasks, so that one's decode,
// waits and epilogue leave the tensor core to the others), with 2 stages each, also with the
// shared expert's E4M3 chunks. The kernel is bound by its warpgroups' latency, not by the ring's
// depth: at two CTAs, 2 stages instead of 4 cost 1.03x, while a third CTA gains 1.07-1.10x
// (one CTA of two warpgroups measured 1.34-1.39x slower than two; one CTA of four
// with four-tile tasks sharing one ring 1.03-1.10x slower; docs/PERFORMANCE.md).
inline constexpr int kWideMaxCtasPerSm = 3;
inline constexpr int kWideMinStages = 2;  // one to fill while the other is read or held
__host__ __device__ constexpr int WideCtasPerSm(bool has_shared) {
  int ctas = kWideMaxCtasPerSm;
  while (ctas > 1 && WideStagesAt(has_shared, ctas) < kWideMinStages) --ctas;
  return ctas;
}
__host__ __device__ constexpr int WideStages(bool has_shared) {
  return WideStagesAt(has_shared, WideCtasPerSm(has_shared));
}
__host__ __device__ constexpr size_t WideSmemBytes(bool has_shared, int stages) {
  return 1024 + static_cast<size_t>(stages) * WideStageBytes(has_shared) + sizeof(Barriers);
}
static_assert(kWideRedBytes <= WideStageBytes(false));
static_assert(WideCtasPerSm(false) == kWideMaxCtasPerSm &&
              WideCtasPerSm(true) == kWideMaxCtasPerSm);
static_assert(WideStages(true) >= kWideMinStages);
static_assert(kWideTokenBytes % 1024 == 0);

// The first N / 2 accumulators of a warpgroup's m64n64 tile as the m64nN operand.
template <int N>
__device__ __forceinline__ float (&AccPrefix(float (&acc)[kWideBm / 2]))[N / 2] {
  return *reinterpret_cast<float(*)[N / 2]>(&acc[0]);
}

// One chunk (the stage at `ring`) of warpgroup `group`'s K loop at MMA width N: per K32 block,
// this warp's lane words of stripe q of tile `group` for that block, the decode of both K16
// steps' A registers, then their two wgmma as one group, waited for before the next block.
// Waiting per block keeps one block's A registers live: three CTAs per SM leave 72 registers,
// where a group in flight across the next block's decode made ptxas serialize every wgmma
// (C7512, insufficient registers) and measured 0.99-1.02x the time of waiting (the SM's other
// five warpgroups fill the tensor core meanwhile). The stage is released after the last block.
template <int N, bool kFp4>
__device__ __forceinline__ void WideChunk(const uint8_t* stage_base, int stage_bytes,
                                          int a_tile_region, Barriers& bars, uint64_t mbar_timeout,
                                          const WaitEnv& env, float (&acc)[N / 2],
                                          const RingCursor& ring, int group, bool release) {
  constexpr TileFormat kFormat = kFp4 ? TileFormat::kE2M1Bf16 : TileFormat::kE4M3;
  constexpr uint32_t kBias = kFp4 ? kE2m1Bf16ScaleBias : kE4m3Bf16ScaleBias;
  constexpr int kPayload = ChunkPayloadBytes(kFormat);
  constexpr int kBlockWords = kFp4 ? 2 : 4;  // per K32 block: rows g, g + 8
  const int warp = (threadIdx.x >> 5) & 3;
  const int lane = threadIdx.x & 31;
  MbarWait(SmemAddr(&bars.full[ring.stage]), ring.phase, mbar_timeout, env, ring.stage);
  if constexpr (kRole2Probe.no_compute) {
    if (release) MbarArrive(SmemAddr(&bars.empty[ring.stage]));
    return;
  }
  const uint8_t* st = stage_base + static_cast<int64_t>(ring.stage) * stage_bytes;
  const uint8_t* a_src = st + kWideTokenBytes + group * a_tile_region + warp * ChunkBytes(kFormat);
  const uint2 codes = *reinterpret_cast<const uint2*>(a_src + kPayload + (lane >> 2) * 8);
  const uint2 sw = make_uint2(BiasScaleBytes(codes.x, kBias), BiasScaleBytes(codes.y, kBias));
  // K16 step 2 kb + h of the chunk (K half kb / 2, bytes 64 (kb % 2) + 32 h of every 128-byte
  // row) by adding its offset / 16 to the descriptor's address word (SmemDescFromLo).
  const uint32_t desc_lo = SmemDescSwizzle128Lo(SmemAddr(st));
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    // Block kb's lane words, words kb * kBlockWords.. of the chunk's (as LoadLaneWords orders
    // them: word i at byte 512 (i / 4) + 16 lane + 4 (i % 4)).
    uint32_t w[kBlockWords];
    if constexpr (kFp4) {
      const uint2 v =
          *reinterpret_cast<const uint2*>(a_src + (kb >> 1) * 512 + lane * 16 + (kb & 1) * 8);
      w[0] = v.x, w[1] = v.y;
    } else {
      const uint4 v = *reinterpret_cast<const uint4*>(a_src + kb * 512 + lane * 16);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    }
    static_assert(kPayload == 4 * 128 * kBlockWords);
    uint32_t a[2][4];
    if constexpr (kRole2Probe.no_decode) {
      for (int i = 0; i < 4; ++i) a[0][i] = w[0], a[1][i] = w[kBlockWords / 2];
    } else {
      DecodeBlockFragments<kFp4>(w, kb < 2 ? sw.x : sw.y, kb, a);
    }
    // The A registers complete before the fence: ptxas serializes every wgmma (C7513) where a
    // non-wgmma instruction defines an operand after it.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < 4; ++i) FenceOperand(a[h][i]);
    }
    if constexpr (kRole2Probe.no_wgmma) continue;
    WgmmaFence();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = (kb >> 1) * kWideTokenHalfBytes + (kb & 1) * 64 + h * 32;
      WgmmaBf16Rs<N>::Run(acc, a[h], SmemDescFromLo(desc_lo + k / 16));
    }
    WgmmaCommit();
    WgmmaWait<0>();
  }
  if (release) {
    FenceProxyAsyncShared();  // behind this thread's generic loads of the stage (the refill)
    MbarArrive(SmemAddr(&bars.empty[ring.stage]));
  }
}

// Warpgroup `group`'s K loop of one task at MMA width N (every block drained, WideChunk).
template <int N, bool kFp4>
__device__ __forceinline__ void WideMainloop(const TaskDesc& d, const uint8_t* stage_base,
                                             int stages, int stage_bytes, int a_tile_region,
                                             Barriers& bars, uint64_t mbar_timeout,
                                             const WaitEnv& env, float (&acc)[N / 2],
                                             RingCursor& ring, int group) {
  const int chunks = d.k / kChunkK;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) FenceOperand(acc[i]);  // zeroed before the first wgmma
  for (int c = 0; c < chunks; ++c, ring.Advance(stages)) {
    WideChunk<N, kFp4>(stage_base, stage_bytes, a_tile_region, bars, mbar_timeout, env, acc, ring,
                       group, c + 1 < chunks);  // the last stage is held for the results
  }
#pragma unroll
  for (int i = 0; i < N / 2; ++i) FenceOperand(acc[i]);
}

// The task's K loop at the MMA width of its valid rows (16, 32, 48 or 64).
template <bool kFp4>
__device__ __forceinline__ void RunWideMainloop(const TaskDesc& d, const uint8_t* stage_base,
                                                int stages, int stage_bytes, int a_tile_region,
                                                Barriers& bars, uint64_t mbar_timeout,
                                                const WaitEnv& env, float (&acc)[kWideBm / 2],
                                                RingCursor& ring, int group) {
#define GCMOE_WIDE_MAINLOOP(N)                                                                 \
  WideMainloop<N, kFp4>(d, stage_base, stages, stage_bytes, a_tile_region, bars, mbar_timeout, \
                        env, AccPrefix<N>(acc), ring, group)
  if (d.rows <= 16) {
    GCMOE_WIDE_MAINLOOP(16);
  } else if (d.rows <= 32) {
    GCMOE_WIDE_MAINLOOP(32);
  } else if (d.rows <= 48) {
    GCMOE_WIDE_MAINLOOP(48);
  } else {
    GCMOE_WIDE_MAINLOOP(64);
  }
#undef GCMOE_WIDE_MAINLOOP
}

}  // namespace gcmoe::kernels::stream_role2
