// role2's producer warp (grouped_gemm_sm90.cu): it claims a task, waits for what the task reads
// (ring block full, W1 tiles done; the weights depend on nothing), publishes the task's
// descriptor, then streams the task's K128 steps into the ring of shared-memory stages
// (stream_pipeline_sm90.cuh): per stage the tiles' chunks as bulk copies, evict-first in L2, and
// the block's BF16 activation rows by TMA boxes (tma_map.h: one per K32 block or K half) or, at
// BM 8, cp.async. One warp issues every copy, so each instruction of its per-stage loop counts:
// its latency is not hidden by a 2-stage ring.
#pragma once

#include <cstdint>

#include "kernels/bf16_wgmma_sm90.cuh"
#include "kernels/device_common.cuh"
#include "kernels/layer_roles.h"
#include "kernels/layer_types.h"
#include "kernels/role2_tasks_sm90.cuh"
#include "kernels/sm90_async.cuh"
#include "kernels/stream_pipeline_sm90.cuh"
#include "kernels/tma_map.h"
#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::kernels::stream_role2 {

static_assert(kWideBm % kTmaWideRows == 0 && kWideN % kTmaWideRows == 0 &&
              kWideBm == kTmaWideHeights * kTmaWideRows &&
              kWideN - kWideBm <= kTmaWideRows);  // a block's boxes, and its tail's one box

// WaitAtLeast (device_common.cuh) inlined and without printf: a call anywhere in a kernel that
// issues wgmma makes ptxas serialize every wgmma (C7510). Same protocol: acquire polls with
// backoff, abort check, and on timeout the host-mapped diagnostic and a trap.
__device__ __forceinline__ bool WaitFlagInline(const WaitEnv& env, const uint32_t* flag,
                                               uint32_t target, int what, int index) {
  if (LdAcquireGpu(flag) >= target) return true;
  const uint64_t start = GlobalTimerNs();
  uint32_t sleep_ns = kFirstWaitSleepNs;
  for (uint32_t spin = 1;; ++spin) {
    __nanosleep(sleep_ns);
    sleep_ns = NextWaitSleep(sleep_ns, spin, env.max_sleep_ns);
    if (LdAcquireGpu(flag) >= target) return true;
    if ((spin & 63) == 0) {
      if (StepAborted(env)) return false;
      if (GlobalTimerNs() - start > env.timeout_ns) {
        TimeoutTrap(env, what, index, target, LdAcquireGpu(flag));
      }
    }
  }
}

// kWide: for GroupedGemmWgmmaBf16Kernel, whose stages hold the token rows first, as K-major
// swizzled K halves [K half][token][128 bytes] (bf16_wgmma_sm90.cuh); kShared: its instance for
// layers with the shared expert (WideTokenRows); kMerge: its instance that runs merged tails
// (RingBlock::tail_rows; without kMerge the marking is ignored and every block runs alone).
template <int BM, bool kWide = false, bool kShared = false, bool kMerge = false>
__device__ void Producer(const LayerParams& p, uint8_t* stage_base, int stages, int stage_bytes,
                         Barriers& bars) {
  constexpr int kActBytes = 2;  // BF16 rows (LayerParams::act_bf16)
  // B (BF16 token rows) comes by TMA from BM 16 on, counted in the stage's expect_tx: the
  // mma.sync consumers read it with generic loads once the stage is full, and the wgmma kernel's
  // wgmma through the async proxy that wrote it, so neither needs a proxy fence. At BM 8 B comes
  // by cp.async and each lane's arrival completes when its copies land: at 1-8 rows a box's
  // latency costs more than the cp.async it saves.
  constexpr bool kTmaB = kWide || BM >= 16;
  constexpr int kTiles = Role2TilesPerTask(BM);
  const int lane = threadIdx.x & 31;
  const StepHeader& hdr = *p.header;
  const WaitEnv env = MakeWaitEnv(p, 2);
  const int T = hdr.num_tokens;
  const int H = p.dims.hidden;
  const int I = p.dims.intermediate;
  const int Is = p.dims.shared_intermediate;
  const int n1 = I / 32;
  const int n1s = Is / 32;
  const int n2 = H / kTileRows;
  const int pull_parts = PullParts(hdr.num_blocks, p.role1_grid);  // role1's pieces per block
  // A task's tile index counts groups of kTiles adjacent tiles.
  const Role2TaskSpace tasks(hdr.num_blocks, hdr.num_shared_blocks, n1 / kTiles, n1s / kTiles,
                             n2 / kTiles);
  const int a_tile_region = ARegionBytes(Is > 0);  // one tile's chunks in a stage
  const int a_region = kTiles * a_tile_region;
  // Where a stage keeps the weights and the activations (bf16_wgmma_sm90.cuh: tokens first,
  // at the stage's 1024-aligned start).
  constexpr int token_half_bytes = WideTokenHalfBytes(kShared);  // kWide
  const uint32_t a_offset = kWide ? 2 * token_half_bytes : 0;
  const uint32_t b_offset = kWide ? 0 : a_region;
  const uint64_t policy = EvictFirstPolicy();
  const uint64_t mbar_timeout = 2 * p.timeout_ns + 1000000000ull;

  RingCursor fill;  // the next stage to fill
  // Waits for `flag` to reach `target` (all lanes; false if the step was aborted), then every
  // lane's own acquire: the cp.async reads it issues follow it, and the consumers see the same
  // writes through the descriptor barrier (release/acquire, CTA scope).
  auto await_flag = [&](const uint32_t* flag, uint32_t target, int what, int index) {
    int ok = lane == 0 && LdAcquireGpu(flag) >= target ? 1 : 0;
    if (!__shfl_sync(0xFFFFFFFFu, ok, 0)) {
      if (lane == 0) ok = WaitFlagInline(env, flag, target, what, index) ? 1 : 0;
    }
    ok = __shfl_sync(0xFFFFFFFFu, ok, 0);
    if (ok) (void)LdAcquireGpu(flag);
    return ok != 0;
  };
  // A routed task of a block merged into the block before it (RingBlock::tail_rows < 0): that
  // block's tasks compute its rows, so it is claimed and dropped. Only the layout of stages
  // without the shared expert has room for a tail (WideTokenRows). The kept task is decoded again
  // below: carrying the decoded task out of this loop cost the kernel 4-8 more spill bytes.
  constexpr bool merging = kWide && kMerge;
  static_assert(!merging || !kShared);
  auto merged_tail = [&](int task) {
    if (!merging || task < tasks.end_shared_w1) return false;
    const Role2Task t = tasks.Decode(task);
    return (t.kind == kRoutedW1 || t.kind == kRoutedW2) && p.blocks[t.block].tail_rows < 0;
  };
  for (uint32_t desc_iter = 0;; ++desc_iter) {
    int task = 0;
    do {
      if (lane == 0) task = static_cast<int>(atomicAdd(&p.sig->task_next, 1u));
      task = __shfl_sync(0xFFFFFFFFu, task, 0);
    } while (task < tasks.total && merged_tail(task));
    const uint64_t claim_ns = p.task_trace != nullptr ? GlobalTimerNs() : 0;
    TaskDesc d{-1, 0, 0, 0, 0, 0, 0, 0};
    const uint8_t* tile_ptr = nullptr;
    const uint8_t* act = nullptr;
    int chunk_bytes = 0;
    int64_t tile_bytes = 0;
    // kTmaB: the activations' matrix and map, and the block's first row. kWide: the map's boxes
    // cover the head block's valid rows (WideActMap), tail_map's a merged tail's.
    ActMap act_matrix = kMapRing;
    const TmaMap* act_map = nullptr;
    const TmaMap* tail_map = nullptr;
    int act_row = 0;
    int tail_row = 0;  // kWide, merged blocks: the map's row of the tail block's first row
    if (task < tasks.total) {
      const auto [kind, block, group] = tasks.Decode(task);
      const int tile = group * kTiles;  // the first of the task's tiles
      const int slot = block % p.ring_blocks;
      const uint32_t* flag;
      uint32_t target;
      int what;
      switch (kind) {
        case kSharedW1:
          flag = &p.sig->x_ready, target = 1, what = kWaitXReady;
          break;
        case kRoutedW1:
          flag = &p.ring_full[slot], target = RingFullTarget(block, p.ring_blocks, pull_parts),
          what = kWaitRingFull;
          break;
        case kSharedW2:
          flag = &p.w1s_done[block], target = static_cast<uint32_t>(n1s), what = kWaitSharedW1Done;
          break;
        default:
          flag = &p.w1_done[block], target = static_cast<uint32_t>(n1), what = kWaitW1Done;
          break;
      }
      const bool routed = kind == kRoutedW1 || kind == kRoutedW2;
      // A merged block's tail is block + 1; its W1 tasks also read the tail's ring slot.
      const int tail_rows = merging && routed ? max(p.blocks[block].tail_rows, 0) : 0;
      const int tail_slot = tail_rows > 0 ? (block + 1) % p.ring_blocks : 0;
      bool ok = await_flag(flag, target, what, block);
      if (ok && tail_rows > 0 && kind == kRoutedW1) {
        ok = await_flag(&p.ring_full[tail_slot],
                        RingFullTarget(block + 1, p.ring_blocks, pull_parts), kWaitRingFull,
                        block + 1);
      }
      if (ok) {
        if constexpr (kTmaB) FenceProxyAsyncGlobal();  // the activations come by TMA
        const RingBlock blk = routed ? p.blocks[block] : RingBlock{};
        const int shared_rows = min(BM, T - block * BM);
        d.kind = kind, d.block = block, d.tile = tile;
        switch (kind) {
          case kSharedW1:
            tile_ptr = hdr.ws1 + tile * TileBytes(TileFormat::kE4M3, H);
            act = reinterpret_cast<const uint8_t*>(p.x_bf) +
                  static_cast<int64_t>(block) * BM * H * kActBytes;
            d.k = H, d.rows = shared_rows;
            act_matrix = kMapXbf, act_row = block * BM;
            break;
          case kRoutedW1:
            tile_ptr = hdr.w1 + (static_cast<int64_t>(blk.local_slot) * n1 + tile) *
                                    TileBytes(TileFormat::kE2M1, H);
            act = p.ring + static_cast<int64_t>(slot) * BM * H * kActBytes;
            d.k = H, d.rows = blk.rows + tail_rows;
            act_matrix = kMapRing, act_row = slot * BM, tail_row = tail_slot * BM;
            break;
          case kSharedW2:
            tile_ptr = hdr.ws2 + tile * TileBytes(TileFormat::kE4M3, Is);
            act = p.hs_q + static_cast<int64_t>(block) * BM * Is * kActBytes;
            d.k = Is, d.rows = shared_rows;
            act_matrix = kMapHs, act_row = block * BM;
            break;
          default:
            tile_ptr = hdr.w2 + (static_cast<int64_t>(blk.local_slot) * n2 + tile) *
                                    TileBytes(TileFormat::kE2M1, I);
            act = p.h_q + static_cast<int64_t>(block) * BM * I * kActBytes;
            d.k = I, d.rows = blk.rows + tail_rows;
            act_matrix = kMapH, act_row = block * BM, tail_row = act_row + BM;
            break;
        }
        d.n = MmaWidth(d.rows, BM);
        if constexpr (kWide) {
          const int head_groups = (min(d.rows, BM) + kTmaWideRows - 1) / kTmaWideRows;
          act_map = &p.act_maps[WideActMap(act_matrix, head_groups)];
          tail_map = &p.act_maps[WideActMap(act_matrix, 1)];
        } else {
          act_map = &p.act_maps[K32ActMap(act_matrix, (d.rows + kTmaRowGroup - 1) / kTmaRowGroup)];
        }
        d.task = task;
        if (hdr.scale_shift != nullptr) {
          const bool routed = kind == kRoutedW1 || kind == kRoutedW2;
          const bool w2 = kind == kRoutedW2 || kind == kSharedW2;
          d.scale_shift =
              hdr.scale_shift[(routed ? blk.local_slot : p.dims.local_experts) * 2 + w2];
        }
        if (p.task_trace != nullptr && lane == 0 && task < p.task_trace_cap) {
          TaskTrace& t = p.task_trace[task];
          t.cta = blockIdx.x, t.sm = SmId(), t.kind = kind, t.recorded = 1;
          t.claim_ns = claim_ns, t.ready_ns = GlobalTimerNs();
        }
        const TileFormat format =
            kind == kRoutedW1 || kind == kRoutedW2 ? TileFormat::kE2M1 : TileFormat::kE4M3;
        chunk_bytes = ChunkBytes(format);
        tile_bytes = TileBytes(format, d.k);  // a matrix's tiles lie back to back
      }
    }
    const int ds = desc_iter % kDescSlots;
    const uint32_t desc_empty = SmemAddr(&bars.desc_empty[ds]);
    const uint32_t desc_parity = ((desc_iter / kDescSlots) & 1) ^ 1;
    if (!__shfl_sync(0xFFFFFFFFu, MbarTryWait(desc_empty, desc_parity) ? 1 : 0, 0)) {
      MbarWait(desc_empty, desc_parity, mbar_timeout, env, 2 * kMaxStages + kDescSlots + ds);
    }
    if (lane == 0) {
      bars.desc[ds] = d;
      MbarArrive(SmemAddr(&bars.desc_full[ds]));
    }
    if (d.kind < 0) {
      // role3, launched programmatically behind this grid on one rank, may be scheduled once
      // every CTA is out of tasks (its CTAs then take the SMs as these leave).
      asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
      break;
    }

    const int chunks = d.k / kChunkK;
    // B's boxes: K32 blocks of 8 rows, the groups covering the valid rows. Each stage expects the
    // weights' bytes plus B's where B comes by TMA.
    const int row_groups = (d.rows + kTmaRowGroup - 1) / kTmaRowGroup;
    const int wide_groups = (d.rows + kTmaWideRows - 1) / kTmaWideRows;  // kWide: 16-row boxes
    uint32_t stage_tx = static_cast<uint32_t>(kTiles * 4 * chunk_bytes);
    if constexpr (kWide) {
      stage_tx += static_cast<uint32_t>(2 * wide_groups * kTmaWideRows * 128);
    } else if constexpr (kTmaB) {
      stage_tx += static_cast<uint32_t>(4 * row_groups * kTmaRowGroup * 32 * 2);
    }
    for (int c = 0; c < chunks; ++c) {
      const int s = fill.stage;
      MbarWait(SmemAddr(&bars.empty[s]), fill.phase ^ 1, mbar_timeout, env, kMaxStages + s);
      const uint32_t full = SmemAddr(&bars.full[s]);
      const uint32_t st = SmemAddr(stage_base + static_cast<int64_t>(s) * stage_bytes);
      // Lane 0 arrives with the stage's bytes first; the copies are each lane's own, issued
      // together: lane t copies tile t's chunk c (the four stripes' chunk c are adjacent in the
      // tile: one contiguous burst per tile). A copy that lands before the arrival only takes the
      // barrier's transaction count below zero for a moment; the phase cannot complete before
      // the arrival. (One lane issuing every copy in turn put them on the producer warp's
      // critical path.)
      if (lane == 0) MbarArriveExpectTx(full, stage_tx);
      if (lane < kTiles) {
        BulkCopyG2S(st + a_offset + lane * a_tile_region,
                    tile_ptr + lane * tile_bytes + static_cast<int64_t>(c) * 4 * chunk_bytes,
                    static_cast<uint32_t>(4 * chunk_bytes), full, policy);
      }
      const uint32_t b_st = st + b_offset;
      if constexpr (kWide) {
        // B [K half][token][128 bytes], 128-byte swizzle: per K half h one TMA box of the block's
        // 16-row groups of valid rows (the MMA width covers them; bf16_wgmma_sm90.cuh), lane
        // kTiles + h's, and one of a merged tail's rows after BM, lane kTiles + 2 + h's. (A box
        // per group cost the producer warp up to 10 copies a stage.)
        const int box = lane - kTiles;  // 0, 1: K halves of the block; 2, 3: of its merged tail
        if (box >= 0 && box < (d.rows > BM ? 4 : 2)) {
          const int h = box & 1;
          const bool tail = box >= 2;
          TmaLoad2D(b_st + h * token_half_bytes + (tail ? BM * 128 : 0), tail ? tail_map : act_map,
                    c * kChunkK + h * 64, tail ? tail_row : act_row, full);
        }
      } else {
        // B [kb][row n][t][16 bytes], BF16 rows already in block column order
        // (bf16_operands.h): unit u = 4 kb + t of a row's chunk is lane t's 8 values of block kb.
        // Only the valid rows (or their 8-row groups): the MMA's other token columns are never
        // read (each column of the result depends on its own column of B only).
        if constexpr (!kTmaB) {
          // Consecutive lanes read one row's 256 contiguous bytes; no scales.
          for (int i = lane; i < d.rows * 16; i += 32) {
            const int n = i >> 4;
            const int u = i & 15;
            CpAsyncCg16(b_st + ((u >> 2) * BM + n) * 64 + (u & 3) * 16,
                        act + (static_cast<int64_t>(n) * d.k + c * kChunkK) * 2 + u * 16);
          }
        } else if (lane < 4) {
          // K32 block kb of the valid 8-row groups is one unswizzled box, lane kb's (act_map's
          // height is theirs).
          TmaLoad2D(b_st + lane * BM * 64, act_map, c * kChunkK + lane * 32, act_row, full);
        }
      }
      fill.Advance(stages);
      if constexpr (kWide) {
        // Nothing more: lane 0's arrive.expect_tx is the stage's one arrival.
      } else if constexpr (kTmaB) {
        // Every lane, after its box if it has one (kFullArrivals): the stage is full once the
        // bytes landed.
        MbarArrive(full);
      } else {
        // No proxy fence is due (mma.sync reads B with generic loads): each lane's arrival
        // completes when its copies land, without the producer coming back to the stage.
        CpAsyncMbarArrive(full);
      }
    }
  }
}

}  // namespace gcmoe::kernels::stream_role2
