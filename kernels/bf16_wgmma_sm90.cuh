// role2 at BM 64 (GroupedGemmWgmmaBf16Kernel in grouped_gemm_sm90.cu): the paper's register-A
// wgmma (§4.4) on exact BF16 operands. Weights decoded in the consumer warps' registers exactly
// as for the BM 8-32 kernel's mma.sync (DecodeWeightUnit: a warp's A registers of a K16 step are the per-warp A fragment
// of wgmma m64nNk16), tokens read by the tensor core from shared memory by descriptor, so one
// wgmma per K16 step multiplies a warpgroup's 64 weight rows with every valid token of the block
// while the SM's other warpgroups decode.
//
// CTA (three per SM, WideCtasPerSm) = two consumer warpgroups (warpgroup w computes tile w of the
// task's two tiles: its warp q holds rows 16q..16q+15, as the BM 8-32 kernel's consumer warp q) +
// one producer warp (the BM 8-32 kernel's Producer, kWide mode). A stage holds the block's BF16
// token rows first (1024-aligned, K-major with the 128-byte swizzle: [K half][row][128 bytes],
// one TMA box of 16 rows per K half and 16-row group of valid rows), then both tiles' chunks.
// full: 1 arrival, the producer's expect_tx of every byte (both copies are async-proxy writes,
// and wgmma reads through the async proxy: no proxy fence); empty: 256, every consumer thread
// once the wgmma of the stage's last K32 block completed, or for a task's last stage, which takes
// the task's results (BF16, both warpgroups' tiles), once its warpgroup's epilogue read them.
//
// The MMA width N is the valid rows rounded up to 8 (valid-M sizing; wgmma's BF16 widths step by 8
// and its time is linear in N), inside the 16-row boxes the producer loads; the columns past the
// valid rows multiply whatever the stage holds there and are never stored.
//
// Merged tails: an expert's last block of at most kWgmmaMaxTailRows rows after a full block
// is computed by the full block's tasks (RingBlock::tail_rows; the host marks them), at N = 80:
// the stage takes the tail's rows as a fifth 16-row box (W1: from the tail's ring slot; W2: the
// next block's h rows, which follow), and the epilogues write the tail's h rows and partials,
// which lie right after the block's. The tail's own tasks are claimed and dropped. Unmerged, such
// a tail decodes its expert's weights again for at most 16 tokens: at GLM-5.2 T = 256 (64 rows
// per expert) 18 of 50 blocks. Merging them is worth about 10 % there; the N = 80 path's
// registers cost up to 3 % at steps without tails, so those run an instance without it.
//
// The tokens' K order is the wgmma order (bf16_operands.h, kBf16WgmmaOrder): K16 step s of a
// block reads its 32 contiguous bytes 32 s.., whose column 2t + e must hold the logical position
// the A register of lane t holds (16 s + 4 t + e, and 16 s + 4 t + 2 + e at column 2t + 8 + e).
// The graph of this block size writes every BF16 row in that order (LayerParams::act_bf16).
#pragma once

#include <cstdint>

#include "kernels/bf16_operands.h"
#include "kernels/device_common.cuh"
#include "kernels/gemm_epilogue_sm90.cuh"
#include "kernels/layer_roles.h"
#include "kernels/scale_bytes.h"
#include "kernels/sm90_async.cuh"
#include "kernels/stream_pipeline_sm90.cuh"
#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::kernels::stream_role2 {

inline constexpr int kWideBm = kWgmmaBm;
// The widest task: a full block with its expert's merged tail block (RingBlock::tail_rows).
inline constexpr int kWideN = kWideBm + kWgmmaMaxTailRows;
inline constexpr int kWideGroups = 2;  // consumer warpgroups, one per tile of the task
inline constexpr int kWideConsumers = kWideGroups * kConsumerThreads;
inline constexpr int kWideThreads = kWideConsumers + 32;
// A stage's token rows, as [K half][row][128 bytes]: kWideN rows, or kWideBm with the shared
// expert, whose E4M3 chunks at 80 rows would leave one stage at three CTAs per SM (so the host
// merges no tails there: CudaBackend::MaxTailRows).
__host__ __device__ constexpr int WideTokenRows(bool has_shared) {
  return has_shared ? kWideBm : kWideN;
}
__host__ __device__ constexpr int WideTokenHalfBytes(bool has_shared) {
  return WideTokenRows(has_shared) * 128;
}
// A warpgroup's results as BF16, red[weight row 0..63][token], written over the stage of the
// task's last chunk once both warpgroups are done with it: exact, as both epilogues round each
// result to BF16 first (gemm_epilogue_sm90.cuh). The pitch, 45 words (odd), spreads the
// epilogues' reads over the banks: the W1 epilogue's rows 4p + i of eight lanes p and the
// scatter's rows 2l + i of 32 lanes l (44 words put them 4- and 8-way on one bank).
inline constexpr int kWideRedPitch = kWideN + 10;
inline constexpr int kWideRedBytes = kWideGroups * kTileRows * kWideRedPitch * 2;

// A stage: the token rows, then the chunks of both tiles, padded to the swizzle atom.
__host__ __device__ constexpr int WideStageBytes(bool has_shared) {
  return (2 * WideTokenHalfBytes(has_shared) + kWideGroups * ARegionBytes(has_shared) + 1023) /
         1024 * 1024;
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
// with four-tile tasks sharing one ring 1.03-1.10x slower; docs/DESIGN-NOTES.md).
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
static_assert(kWideRedBytes <= WideStageBytes(false) && kWideRedBytes <= WideStageBytes(true));
static_assert(WideCtasPerSm(false) == kWideMaxCtasPerSm &&
              WideCtasPerSm(true) == kWideMaxCtasPerSm);
static_assert(WideStages(true) >= kWideMinStages);
static_assert(WideTokenHalfBytes(false) % 1024 == 0 && WideTokenHalfBytes(true) % 1024 == 0);

// One chunk (the stage at `ring`) of warpgroup `group`'s K loop at MMA width N: per K32 block,
// this warp's lane words of stripe q of tile `group` for that block, the decode of both K16
// steps' A registers, then their two wgmma as one group, waited for before the next block.
// Waiting per block keeps one block's A registers live: three CTAs per SM leave 72 registers.
// Decoding block kb + 1 while block kb's wgmma run gained nothing measurable: the SM's other five
// warpgroups fill the tensor core meanwhile. The stage is released after the last block.
template <int N, bool kFp4>
__device__ __forceinline__ void WideChunk(const uint8_t* stage_base, int stage_bytes,
                                          int a_tile_region, Barriers& bars, uint64_t mbar_timeout,
                                          const WaitEnv& env, float (&acc)[N / 2],
                                          const RingCursor& ring, int group, int token_half_bytes,
                                          bool release) {
  constexpr TileFormat kFormat = kFp4 ? TileFormat::kE2M1Bf16 : TileFormat::kE4M3;
  constexpr uint32_t kBias = kFp4 ? kE2m1Bf16ScaleBias : kE4m3Bf16ScaleBias;
  constexpr int kPayload = ChunkPayloadBytes(kFormat);
  constexpr int kBlockWords = kFp4 ? 2 : 4;  // per K32 block: rows g, g + 8
  const int warp = (threadIdx.x >> 5) & 3;
  const int lane = threadIdx.x & 31;
  MbarWait(SmemAddr(&bars.full[ring.stage]), ring.phase, mbar_timeout, env, ring.stage);
  const uint8_t* st = stage_base + static_cast<int64_t>(ring.stage) * stage_bytes;
  const uint8_t* a_src =
      st + 2 * token_half_bytes + group * a_tile_region + warp * ChunkBytes(kFormat);
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
    // At N = 80 (a merged tail) one K16 step's A registers at a time, each step's wgmma waited
    // for: with both steps' registers live ptxas runs out at three CTAs per SM and serializes
    // every wgmma of the kernel (C7512), not only these.
    constexpr int kSteps = N > kWideBm ? 1 : 2;  // steps decoded and issued as one group
#pragma unroll
    for (int h0 = 0; h0 < 2; h0 += kSteps) {
      uint32_t a[kSteps][4];
      if constexpr (kSteps == 2) {
        DecodeBlockFragments<kFp4>(w, kb < 2 ? sw.x : sw.y, kb, a);
      } else {
        DecodeStepFragments<kFp4>(w, kb < 2 ? sw.x : sw.y, kb, h0, a[0]);
      }
      // The A registers complete before the fence: ptxas serializes every wgmma (C7513) where a
      // non-wgmma instruction defines an operand after it.
#pragma unroll
      for (int q = 0; q < kSteps; ++q) {
#pragma unroll
        for (int i = 0; i < 4; ++i) FenceOperand(a[q][i]);
      }
      WgmmaFence();
#pragma unroll
      for (int q = 0; q < kSteps; ++q) {
        const uint32_t k = (kb >> 1) * token_half_bytes + (kb & 1) * 64 + (h0 + q) * 32;
        WgmmaBf16Rs<N>::Run(acc, a[q], SmemDescFromLo(desc_lo + k / 16));
      }
      WgmmaCommit();
      WgmmaWait<0>();
    }
  }
  if (release) {
    FenceProxyAsyncShared();  // behind this thread's generic loads of the stage (the refill)
    MbarArrive(SmemAddr(&bars.empty[ring.stage]));
  }
}

// Warpgroup `group`'s task at MMA width N: the K loop (every block drained, WideChunk) into its
// own m64nN accumulator, times 2^scale_shift, plus its tile's biases (kExtended: AddTileBias),
// then, once both warpgroups are done with the stage of the last chunk (their last wgmma
// completed, their loads done), its tile's results as BF16 over that stage: red[row][token],
// `kWideRedPitch` values a row, tile `group` after tile 0.
// Returns the warpgroup's red tile. Each N has its own accumulator: one sized for the widest
// task kept 8 registers live through every narrower K loop and cost 1.03-1.05x there.
template <int N, bool kFp4, bool kExtended>
__device__ __forceinline__ uint16_t* WideTask(const LayerParams& p, const TaskDesc& d,
                                              uint8_t* stage_base, int stages,
                                              int stage_bytes, int a_tile_region, Barriers& bars,
                                              uint64_t mbar_timeout, const WaitEnv& env,
                                              RingCursor& ring, int group, int token_half_bytes) {
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
  const int chunks = d.k / kChunkK;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) FenceOperand(acc[i]);  // zeroed before the first wgmma
  for (int c = 0; c < chunks; ++c, ring.Advance(stages)) {
    WideChunk<N, kFp4>(stage_base, stage_bytes, a_tile_region, bars, mbar_timeout, env, acc, ring,
                       group, token_half_bytes,
                       c + 1 < chunks);  // the last stage is held for the results
  }
#pragma unroll
  for (int i = 0; i < N / 2; ++i) FenceOperand(acc[i]);
  if (d.scale_shift != 0) {
    const float undo = FloatFromBits(static_cast<uint32_t>(127 + d.scale_shift) << 23);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] *= undo;  // exact: a power of two
  }
  if constexpr (kExtended) {
    if (const float* bias = TileBias(p, d.kind, d.block, d.tile + group); bias != nullptr) {
      // A merged tail's rows (tokens 64..) have their metadata right after the block's.
      const RowMeta* meta = p.meta + static_cast<int64_t>(d.block) * kWideBm;
      const int row0 = 16 * ((threadIdx.x >> 5) & 3) + ((threadIdx.x & 31) >> 2);
      if (d.kind == kRoutedW2) {
        AddTileBias<N, true>(acc, bias, row0, meta, d.rows);
      } else {
        AddTileBias<N, false>(acc, bias, row0, meta, d.rows);
      }
    }
  }
  const int held = ring.stage == 0 ? stages - 1 : ring.stage - 1;
  NamedBarrier(kConsumerBarrierId, kWideConsumers);
  uint16_t* red_tile =
      reinterpret_cast<uint16_t*>(stage_base + static_cast<int64_t>(held) * stage_bytes) +
      group * kTileRows * kWideRedPitch;
  // acc[4j + q] is row 16 warp + g + 8 (q >> 1), token 8j + 2t + (q & 1) (the wgmma m64nN
  // accumulator layout), a token pair per word; the epilogue reads the valid tokens only.
  const int warp = (threadIdx.x >> 5) & 3;
  const int g = (threadIdx.x & 31) >> 2;
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      *reinterpret_cast<uint32_t*>(
          &red_tile[(16 * warp + g + 8 * h) * kWideRedPitch + 8 * j + 2 * t]) =
          Bf16Bits(acc[4 * j + 2 * h]) | (Bf16Bits(acc[4 * j + 2 * h + 1]) << 16);
    }
  }
  return red_tile;
}

// The task at the MMA width of its valid rows rounded up to 8 (8 .. 64, or with kMerging 72 or 80
// for a block with its merged tail).
template <bool kFp4, bool kMerging, bool kExtended>
__device__ __forceinline__ uint16_t* RunWideTask(const LayerParams& p, const TaskDesc& d,
                                                 uint8_t* stage_base, int stages,
                                                 int stage_bytes, int a_tile_region, Barriers& bars,
                                                 uint64_t mbar_timeout, const WaitEnv& env,
                                                 RingCursor& ring, int group,
                                                 int token_half_bytes) {
#define GCMOE_WIDE_TASK(N)                                                                        \
  return WideTask<N, kFp4, kExtended>(p, d, stage_base, stages, stage_bytes, a_tile_region, bars, \
                                      mbar_timeout, env, ring, group, token_half_bytes)
  if (d.rows <= 8) GCMOE_WIDE_TASK(8);
  if (d.rows <= 16) GCMOE_WIDE_TASK(16);
  if (d.rows <= 24) GCMOE_WIDE_TASK(24);
  if (d.rows <= 32) GCMOE_WIDE_TASK(32);
  if (d.rows <= 40) GCMOE_WIDE_TASK(40);
  if (d.rows <= 48) GCMOE_WIDE_TASK(48);
  if (d.rows <= 56) GCMOE_WIDE_TASK(56);
  if (!kMerging || d.rows <= 64) GCMOE_WIDE_TASK(64);
  if constexpr (kMerging) {  // a block with its merged tail
    if (d.rows <= 72) GCMOE_WIDE_TASK(72);
    GCMOE_WIDE_TASK(80);
  }
#undef GCMOE_WIDE_TASK
}

}  // namespace gcmoe::kernels::stream_role2
