// The `decoded` role2 at BM 64 (GemmKernel::kDecodedBf16, opt-in; GroupedGemmDecodedKernel in
// grouped_gemm_wgmma_fp8_fp4_sm90.cu): the weights decoded once per task into BF16 tiles in
// shared memory by decode warpgroups, and shared-memory wgmma by an MMA warpgroup with the roles
// of the operands swapped: the block's 64 tokens are wgmma's M side (A) and the task's 128
// weight rows (two tiles) its N side (B), so one m64n128k16 per K16 step multiplies every decoded
// weight by every token of the block. Same operands and sums as the bf16 kernels.
//
// Why not register-A wgmma with the decode in the consumer warps (what the mma.sync kernels do):
// a register-A wgmma is warpgroup-synchronous, so every K32 block's MMAs couple the four warps'
// decodes; a BF16 variant measured 1.2-1.5x slower than mma.sync (docs/PERFORMANCE.md, session
// 9). Here the decode never waits on an MMA: the warpgroups meet only at the rings.
//
// Status: correct (every GPU test), and 1.25-1.9x slower than the bf16 kernel's BM 32 at 64-256
// tokens per rank (GLM-5.2 T = 64 / 256: 526 / 915 us against 277 / 724, H200, 2026-12-02).
// Ruled out by measurement: the decode's throughput (a second decode warpgroup: no change), the
// operand layout (non-swizzled against swizzled: no change), the weights' HBM latency (L2
// prefetch 8 or 16 chunks ahead: no change), the one accumulator chain (two m64n64 chains, one
// per tile: 1.08x slower), and per-thread barrier arrivals (one arrival per warp behind
// __syncwarp: 1.04x slower). What paid: the token rows by TMA instead of one producer warp's
// cp.async (1.22x at T = 256). docs/PERFORMANCE.md, sessions 9 and 10, has the numbers.
//
// CTA (one per SM) = MMA warpgroup (warps 0-3) + two decode warpgroups (warps 4-11, one per tile
// of the task) + producer (warp 12, the streaming kernels' Producer). Both operands are K-major
// with the 128-byte swizzle (SmemDescSwizzle128): each K128 chunk is two K halves of 64 values,
// a row's half is one 128-byte row of the layout. Rings:
//   input stages (1024-aligned): the block's BF16 token rows (kDecodedTokenBytes: [K half][token]
//     [128 bytes], one TMA box of 64 rows per K half, tma_map.h: the swizzle is the map's), then
//     the task's raw weight chunks (bulk copy). full: 1 arrival, the producer's expect_tx of
//     every byte (both copies are async-proxy writes, as wgmma reads them: no proxy fence);
//     empty: 384 (the decode warpgroups once they decoded the chunk, the MMA warpgroup once the
//     wgmma of its second K half completed).
//   decoded stages (kDecodedStages, one K half each: 128 rows x [128 bytes]): full: 256 decode
//     arrivals after a proxy fence (generic stores, async-proxy reads); empty: 128 MMA arrivals
//     after the wgmma group that read it completed. Half stages hold what two whole-chunk
//     stages held (64 KiB) and let the decode run three halves ahead; in the cp.async build they
//     measured 1.01x slower than whole stages, and the TMA build was measured with them only.
// A decode lane 4g + t stores unit 4kb + t of rows g and g + 8 of its stripe; under the swizzle the
// units of K32 blocks kb and kb ^ 1 of rows g and g ^ 1 would share bank groups, so lanes of odd
// g store the blocks in the order 1, 0, 3, 2: every 8-lane phase of a store is conflict-free.
// Both operands hold K in the BF16 rows' MMA column order (bf16_operands.h): the decoded unit of
// lane t of K32 block kb is the rows' values 8t..8t+7 of that block, exactly where the token rows
// keep the matching activations, so the sums pair matching positions.
#pragma once

#include <cstdint>

#include "kernels/bf16_operands.h"
#include "kernels/device_common.cuh"
#include "kernels/gemm_epilogue_sm90.cuh"
#include "kernels/scale_bytes.h"
#include "kernels/sm90_async.cuh"
#include "kernels/stream_pipeline_sm90.cuh"
#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::kernels::stream_role2 {

inline constexpr int kDecodedBm = 64;
inline constexpr int kDecodedRows = 2 * kTileRows;            // weight rows per task (two tiles)
inline constexpr int kDecodedHalfBytes = kDecodedRows * 128;  // one K half of a chunk
inline constexpr int kDecodedStageBytes = kDecodedHalfBytes;  // a decoded stage: one K half
inline constexpr int kDecodedTokenHalfBytes = kDecodedBm * 128;
inline constexpr int kDecodedTokenBytes = 2 * kDecodedTokenHalfBytes;
inline constexpr int kDecodedStages = 4;
inline constexpr int kDecodeWarpgroups = 2;  // one per tile of the task
inline constexpr int kDecodedThreads = (1 + kDecodeWarpgroups) * kConsumerThreads + 32;
inline constexpr int kDecodedEmptyArrivals = (1 + kDecodeWarpgroups) * kConsumerThreads;
// The task's FP32 results, red[weight row 0..127][token], padded against conflicts.
inline constexpr int kDecodedRedPitch = kDecodedBm + 1;
inline constexpr int kDecodedRedBytes = kDecodedRows * kDecodedRedPitch * 4;

struct DecodedBarriers {
  Barriers ring;  // input stages and task descriptors (the Producer's)
  uint64_t dec_full[kDecodedStages];
  uint64_t dec_empty[kDecodedStages];
};

// An input stage: the token rows, then the raw chunks of both tiles, padded to the atom alignment.
__host__ __device__ constexpr int DecodedInputStageBytes(bool has_shared) {
  return (kDecodedTokenBytes + 2 * ARegionBytes(has_shared) + 1023) / 1024 * 1024;
}
// Input stages that fit one CTA per SM beside the decoded stages and the results (the layout's
// 1024-byte alignment may cost up to 1023 bytes at the start).
__host__ __device__ constexpr int DecodedInputStages(bool has_shared) {
  return (kSmemPerSm - kSmemReservedPerCta - 1024 - kDecodedStages * kDecodedStageBytes -
          kDecodedRedBytes - static_cast<int>(sizeof(DecodedBarriers))) /
         DecodedInputStageBytes(has_shared);
}
__host__ __device__ constexpr size_t DecodedSmemBytes(bool has_shared, int stages) {
  return 1024 + static_cast<size_t>(stages) * DecodedInputStageBytes(has_shared) +
         kDecodedStages * kDecodedStageBytes + kDecodedRedBytes + sizeof(DecodedBarriers);
}
static_assert(DecodedInputStages(true) >= kMinStages);
static_assert(kDecodedStageBytes % 1024 == 0 && kDecodedTokenBytes % 1024 == 0);

// A decode warpgroup's K loop of one task: per chunk, warp w of warpgroup `tile` decodes stripe w
// of that tile (the rows the streaming kernels' consumer warp w holds) into two decoded stages,
// one per K half.
template <bool kFp4>
__device__ __forceinline__ void DecodeTask(const TaskDesc& d, const uint8_t* stage_base, int stages,
                                           int stage_bytes, int a_region, uint8_t* decoded,
                                           DecodedBarriers& bars, uint64_t mbar_timeout,
                                           const WaitEnv& env, RingCursor& ring, RingCursor& dec,
                                           int tile) {
  constexpr TileFormat kFormat = kFp4 ? TileFormat::kE2M1Bf16 : TileFormat::kE4M3;
  constexpr uint32_t kBias = kFp4 ? kE2m1Bf16ScaleBias : kE4m3Bf16ScaleBias;
  constexpr int kPayload = ChunkPayloadBytes(kFormat);
  constexpr int kWords = kPayload / 128;
  const int warp = (threadIdx.x >> 5) & 3;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int a_tile_region = a_region / 2;
  const int chunks = d.k / kChunkK;
  const int swap = g & 1;  // this lane stores K32 block kb ^ swap at step kb
  const int row = tile * kTileRows + warp * 16 + g;
  for (int c = 0; c < chunks; ++c, ring.Advance(stages)) {
    MbarWait(SmemAddr(&bars.ring.full[ring.stage]), ring.phase, mbar_timeout, env, ring.stage);
    const uint8_t* st = stage_base + static_cast<int64_t>(ring.stage) * stage_bytes;
    {
      const uint8_t* a_src =
          st + kDecodedTokenBytes + tile * a_tile_region + warp * ChunkBytes(kFormat);
      uint32_t w[kWords];
      LoadLaneWords<kPayload / 512>(a_src, lane, w);
      const uint2 codes = *reinterpret_cast<const uint2*>(a_src + kPayload + g * 8);
      const uint2 sw = make_uint2(BiasScaleBytes(codes.x, kBias), BiasScaleBytes(codes.y, kBias));
#pragma unroll
      for (int step = 0; step < 4; ++step) {
        if ((step & 1) == 0) {  // K half step / 2: its decoded stage
          MbarWait(SmemAddr(&bars.dec_empty[dec.stage]), dec.phase ^ 1, mbar_timeout, env,
                   3 * kMaxStages + dec.stage);
        }
        uint8_t* half = decoded + dec.stage * kDecodedStageBytes;
        const int kb = step ^ swap;
        const uint32_t sw_word = step < 2 ? sw.x : sw.y;  // kb < 2 as well
        const uint32_t f_g = BiasedScaleBytePair(sw_word, (kb & 1) * 2);
        const uint32_t f_g8 = BiasedScaleBytePair(sw_word, (kb & 1) * 2 + 1);
        // Block kb's words (selected, not indexed: w stays in registers): FP4, one lane word per
        // row; E4M3, row g's low and high runs, then row g + 8's.
        constexpr int kBlockWords = kFp4 ? 2 : 4;
        uint32_t wk[kBlockWords];
#pragma unroll
        for (int i = 0; i < kBlockWords; ++i) {
          wk[i] = swap ? w[(step ^ 1) * kBlockWords + i] : w[step * kBlockWords + i];
        }
        uint32_t u_g[4];
        uint32_t u_g8[4];
        DecodeWeightUnit<kFp4>(&wk[0], f_g, u_g);
        DecodeWeightUnit<kFp4>(&wk[kBlockWords / 2], f_g8, u_g8);
        // Unit 4 kb + t of the chunk: K half kb / 2, unit 4 (kb % 2) + t of its 128-byte row.
        const int unit = 4 * (kb & 1) + t;
        *reinterpret_cast<uint4*>(half + Swizzle128Offset(row, unit)) =
            make_uint4(u_g[0], u_g[1], u_g[2], u_g[3]);
        *reinterpret_cast<uint4*>(half + Swizzle128Offset(row + 8, unit)) =
            make_uint4(u_g8[0], u_g8[1], u_g8[2], u_g8[3]);
        if (step & 1) {
          // The half's stores before wgmma's reads (and the chunk's raw loads before the refill).
          FenceProxyAsyncShared();
          MbarArrive(SmemAddr(&bars.dec_full[dec.stage]));
          dec.Advance(kDecodedStages);
        }
      }
    }
    MbarArrive(SmemAddr(&bars.ring.empty[ring.stage]));
  }
}

// The MMA warpgroup's K loop of one task: acc[4j + q] = token 16 w + g + 8 (q >> 1) (warp w,
// lane 4g + t) against weight row 8 j + 2 t + (q & 1) of the task's 128, over the whole K. One
// K half's wgmma group stays in flight while the next half's is issued; each decoded stage is
// released once its group completed, the input stage once its second half's did.
__device__ __forceinline__ void MmaTask(const TaskDesc& d, const uint8_t* stage_base, int stages,
                                        int stage_bytes, int a_region, const uint8_t* decoded,
                                        DecodedBarriers& bars, uint64_t mbar_timeout,
                                        const WaitEnv& env, float (&acc)[64], RingCursor& ring,
                                        RingCursor& dec) {
  const int chunks = d.k / kChunkK;
  // The group in flight: its decoded stage, and the input stage it finished (last half only).
  RingCursor prev_ring;
  RingCursor prev_dec;
  bool prev_last = false;
  auto release = [&]() {
    FenceProxyAsyncShared();
    MbarArrive(SmemAddr(&bars.dec_empty[prev_dec.stage]));
    if (prev_last) MbarArrive(SmemAddr(&bars.ring.empty[prev_ring.stage]));
  };
  for (int c = 0; c < chunks; ++c) {
    MbarWait(SmemAddr(&bars.ring.full[ring.stage]), ring.phase, mbar_timeout, env, ring.stage);
    const uint32_t tokens = SmemAddr(stage_base + static_cast<int64_t>(ring.stage) * stage_bytes);
    // The token rows came by TMA (the async proxy, as wgmma reads them): no proxy fence.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      MbarWait(SmemAddr(&bars.dec_full[dec.stage]), dec.phase, mbar_timeout, env,
               3 * kMaxStages + kDecodedStages + dec.stage);
      const uint32_t weights = SmemAddr(decoded + dec.stage * kDecodedStageBytes);
      WgmmaFence();
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        // K16 step s of K half h: bytes 32 s .. of every 128-byte row.
        const uint32_t k = static_cast<uint32_t>(32 * s);
        const uint64_t desc_a =
            SmemDescSwizzle128(tokens + static_cast<uint32_t>(h * kDecodedTokenHalfBytes) + k);
        const uint64_t desc_b = SmemDescSwizzle128(weights + k);
        WgmmaBf16SsN128(acc, desc_a, desc_b);
      }
      WgmmaCommit();
      if (c > 0 || h > 0) {
        WgmmaWait<1>();
        release();
      }
      prev_ring = ring;
      prev_dec = dec;
      prev_last = h == 1;
      dec.Advance(kDecodedStages);
    }
    ring.Advance(stages);
  }
  WgmmaWait<0>();
#pragma unroll
  for (int i = 0; i < 64; ++i) FenceOperand(acc[i]);
  if (chunks > 0) release();
}

}  // namespace gcmoe::kernels::stream_role2
