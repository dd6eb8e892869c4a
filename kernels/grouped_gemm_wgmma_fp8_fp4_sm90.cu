// role2 on Hopper: the grouped GEMM of a GC-MoE layer (DESIGN.md §4 steps 2-4, §6; the paper's
// sm90 path, §4.4), warp-specialized so that weight streaming never waits on arithmetic.
//
// A task is one 64-row weight tile (weight_tiles_sm90.h) against one block of tokens, as in the
// stepping stone (grouped_gemm_fp8_fp4_sm90.cu): shared W1, routed W1, shared W2, routed W2,
// claimed in that order from one cursor, so a W2 task is claimed only after every W1 task of
// its block was claimed by a running CTA and its wait cannot deadlock.
//
// CTA = one consumer warpgroup (warps 0-3) + one producer warp (warp 4).
//   producer: claims a task, waits for what it reads (ring block full / W1 tiles done; the
//     weights depend on nothing), publishes a task descriptor, then streams the task's K128
//     steps into a ring of shared-memory stages: the tile's four stripe chunks as one bulk copy
//     (one contiguous burst, evict-first in L2) completing on the stage's `full` barrier, and
//     the block's activations (E4M3, n rows x 128) plus the 16-byte window of each row's UE8M0
//     scales through cp.async (L2 only), released on the same barrier kLagStages stages later
//     (the bf16 kernel: BF16 rows, 256 bytes per valid row, no scales, and each lane's
//     cp.async arrival completes on the barrier by itself when its copies land).
//     The ring spans task boundaries, so the next task's weights stream during this epilogue.
//   consumers: per stage, two 16-byte shared loads per lane (E2M1) give the A fragments of the
//     four K32 scale blocks; FP4 is decoded to E4M3 (times 2^-6) in registers by masks and one
//     rotation (weight_tiles_sm90.h), then one of
//       kWgmma = true:  wgmma m64nNk32 E4M3 (A from registers, B = activations by descriptor)
//                       into a fresh FP32 tile per K32, folded in while the next K32 runs;
//       kWgmma = false: mma.sync m16n8k32 E4M3 per warp from the same shared-memory B (the
//                       default's W1: FP8 wgmma sums a K32 block at reduced precision, and
//                       the E4M3 requantization of h would turn that into flipped codes; the
//                       default's W2 at BM <= 32 takes kWgmma = true: layer_roles.h)
//     and the per-32 weight and activation scales are applied by FMA into the accumulator;
//     or (GemmKernel::kStreamBf16, MainloopBf16) FP4 is decoded to BF16 and multiplied by its
//     block scale, and mma.sync m16n8k16 BF16 sums the whole K of exact operands in FP32.
//     Then the fused epilogue (SwiGLU + routing weight + E4M3 requantization, or the BF16
//     scatter to the combine buffer).
//   valid-M sizing: the MMA width n is the smallest of 8, 16, 32, 64 covering the block's rows,
//     so a partially filled block streams and multiplies fewer token columns.
//
// The pipeline's layout and invariants: stream_pipeline_sm90.cuh; the consumers' K loops:
// stream_mainloops_sm90.cuh. The default's BM 64 (`bf16-wgmma`: two consumer warpgroups on
// register-A BF16 wgmma, three CTAs per SM) has its own CTA below and its K loop in
// bf16_wgmma_sm90.cuh.
#include <cstdint>

#include "kernels/bf16_wgmma_sm90.cuh"
#include "kernels/device_common.cuh"
#include "kernels/gemm_epilogue_sm90.cuh"
#include "kernels/layer_roles.h"
#include "kernels/role2_probe.h"
#include "kernels/role2_tasks_sm90.cuh"
#include "kernels/sm90_async.cuh"
#include "kernels/stream_mainloops_sm90.cuh"
#include "kernels/stream_pipeline_sm90.cuh"
#include "kernels/tma_map.h"
#include "kernels/weight_tiles_sm90.h"

static_assert(gcmoe::kernels::stream_role2::kWideBm % gcmoe::kernels::kTmaWideRows == 0 &&
              gcmoe::kernels::stream_role2::kWideN % gcmoe::kernels::kTmaWideRows == 0 &&
              gcmoe::kernels::stream_role2::kWideBm ==
                  gcmoe::kernels::kTmaWideHeights * gcmoe::kernels::kTmaWideRows &&
              gcmoe::kernels::stream_role2::kWideN - gcmoe::kernels::stream_role2::kWideBm <=
                  gcmoe::kernels::kTmaWideRows);  // a block's boxes, and its tail's one box

namespace gcmoe::kernels {
namespace {

using namespace stream_role2;  // the pipeline and K loops of this kernel, in their own headers

// ---- producer ---------------------------------------------------------------------------------

// WaitAtLeast (device_common.cuh) inlined and without printf: a call anywhere in a kernel that
// issues wgmma makes ptxas serialize every wgmma (C7510). Same protocol: acquire polls with
// backoff, abort check, and on timeout the host-mapped diagnostic and a trap.
__device__ __forceinline__ bool WaitFlagInline(const WaitEnv& env, const uint32_t* flag,
                                               uint32_t target, int what, int index) {
  if (LdAcquireGpu(flag) >= target) return true;
  const uint64_t start = GlobalTimerNs();
  uint32_t sleep_ns = 32;
  for (uint32_t spin = 1;; ++spin) {
    __nanosleep(sleep_ns);
    if (sleep_ns < 512) sleep_ns *= 2;
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
template <int BM, GemmKernel kKernel, bool kWide = false, bool kShared = false, bool kMerge = false>
__device__ void Producer(const LayerParams& p, uint8_t* stage_base, int stages, int stage_bytes,
                         Barriers& bars) {
  constexpr bool kBf16 = kKernel == GemmKernel::kStreamBf16;
  constexpr int kActBytes = kBf16 ? 2 : 1;  // LayerParams::act_bf16
  // The bf16 kernels' B (BF16 token rows) comes by TMA from BM 16 on, counted in the stage's
  // expect_tx: the mma.sync consumers read it with generic loads once the stage is full, and the
  // bf16-wgmma kernel's wgmma through the async proxy that wrote it, so neither needs a proxy
  // fence. Elsewhere B comes by cp.async: at BM 8 each lane's arrival completes when its copies
  // land; the FP8 kernels release their stages behind a proxy fence (`release` below).
  // At BM 8 (1-8 rows) a box's latency cost more than the cp.async it saves: 0.92-0.97x at 1-4
  // tokens per rank, against 1.01-1.03x at BM 16-32 (measured, H200, 2026-12-02).
  constexpr bool kTmaB = kBf16 && (kWide || BM >= 16);
  constexpr int kTiles = Role2TilesPerTask(kKernel, BM);
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
  // The `pending` stages before `fill`, from `release` on, have their bulk copies issued but
  // this lane's cp.async not yet released: cp.async writes shared memory through the generic
  // proxy and wgmma reads it through the async proxy, so the writing thread waits for its
  // copies, executes fence.proxy.async, and only then arrives on the stage's full barrier.
  // The bf16 kernel has none pending: its consumers read B with generic loads.
  RingCursor release;
  int pending = 0;
  auto release_oldest = [&]() {
    MbarArrive(SmemAddr(&bars.full[release.stage]));
    release.Advance(stages);
    --pending;
  };
  // Before anything that may block on the consumers or on other CTAs.
  auto release_all = [&]() {
    if (pending == 0) return;
    asm volatile("cp.async.wait_all;" ::: "memory");
    FenceProxyAsyncShared();
    while (pending != 0) release_oldest();
  };
  // Waits for `flag` to reach `target` (all lanes; false if the step was aborted), then every
  // lane's own acquire: the cp.async reads it issues follow it, and the consumers see the same
  // writes through the descriptor barrier (release/acquire, CTA scope).
  auto await_flag = [&](const uint32_t* flag, uint32_t target, int what, int index) {
    int ok = lane == 0 && LdAcquireGpu(flag) >= target ? 1 : 0;
    if (!__shfl_sync(0xFFFFFFFFu, ok, 0)) {
      release_all();  // the awaited W1 tiles may be this CTA's own
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
    TaskDesc d{-1, 0, 0, 0, 0, 0, 0, 0, 0};
    const uint8_t* tile_ptr = nullptr;
    const uint8_t* act = nullptr;
    const uint8_t* act_scales = nullptr;
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
            act = (kBf16 ? reinterpret_cast<const uint8_t*>(p.x_bf) : p.x_q) +
                  static_cast<int64_t>(block) * BM * H * kActBytes;
            act_scales = p.x_s + static_cast<int64_t>(block) * BM * (H / 32);
            d.k = H, d.rows = shared_rows;
            act_matrix = kMapXbf, act_row = block * BM;
            break;
          case kRoutedW1:
            tile_ptr = hdr.w1 + (static_cast<int64_t>(blk.local_slot) * n1 + tile) *
                                    TileBytes(TileFormat::kE2M1, H);
            act = p.ring + static_cast<int64_t>(slot) * BM * H * kActBytes;
            act_scales = p.ring_scales + static_cast<int64_t>(slot) * BM * (H / 32);
            d.k = H, d.rows = blk.rows + tail_rows;
            act_matrix = kMapRing, act_row = slot * BM, tail_row = tail_slot * BM;
            break;
          case kSharedW2:
            tile_ptr = hdr.ws2 + tile * TileBytes(TileFormat::kE4M3, Is);
            act = p.hs_q + static_cast<int64_t>(block) * BM * Is * kActBytes;
            act_scales = p.hs_s + static_cast<int64_t>(block) * BM * (Is / 32);
            d.k = Is, d.rows = shared_rows;
            act_matrix = kMapHs, act_row = block * BM;
            break;
          default:
            tile_ptr = hdr.w2 + (static_cast<int64_t>(blk.local_slot) * n2 + tile) *
                                    TileBytes(TileFormat::kE2M1, I);
            act = p.h_q + static_cast<int64_t>(block) * BM * I * kActBytes;
            act_scales = p.h_s + static_cast<int64_t>(block) * BM * (I / 32);
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
        d.scale_mod = static_cast<int32_t>(reinterpret_cast<uintptr_t>(act_scales) & 15);
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
      release_all();  // the consumers may need those stages to finish the task before
      MbarWait(desc_empty, desc_parity, mbar_timeout, env, 2 * kMaxStages + kDescSlots + ds);
    }
    if (lane == 0) {
      bars.desc[ds] = d;
      MbarArrive(SmemAddr(&bars.desc_full[ds]));
    }
    if (d.kind < 0) break;

    const int chunks = d.k / kChunkK;
    const int scale_row = d.k / 32;
    // The bf16 kernels' B boxes: K32 blocks of 8 rows, the groups covering the valid rows. Each
    // stage expects the weights' bytes plus B's where B comes by TMA.
    const int row_groups = (d.rows + kTmaRowGroup - 1) / kTmaRowGroup;
    const int wide_groups = (d.rows + kTmaWideRows - 1) / kTmaWideRows;  // kWide: 16-row boxes
    // Probe builds (role2_probe.h) may leave either part out of the wide kernel's stages.
    constexpr bool kLoadWeights = !kWide || !kRole2Probe.no_weights;
    constexpr bool kLoadTokens = !kWide || !kRole2Probe.no_tokens;
    uint32_t stage_tx = kLoadWeights ? static_cast<uint32_t>(kTiles * 4 * chunk_bytes) : 0u;
    if constexpr (kWide && kLoadTokens) {
      stage_tx += static_cast<uint32_t>(2 * wide_groups * kTmaWideRows * 128);
    } else if constexpr (kTmaB) {
      stage_tx += static_cast<uint32_t>(4 * row_groups * kTmaRowGroup * 32 * 2);
    }
    for (int c = 0; c < chunks; ++c) {
      const int s = fill.stage;
      MbarWait(SmemAddr(&bars.empty[s]), fill.phase ^ 1, mbar_timeout, env, kMaxStages + s);
      const uint32_t full = SmemAddr(&bars.full[s]);
      const uint32_t st = SmemAddr(stage_base + static_cast<int64_t>(s) * stage_bytes);
      if (lane == 0) {
        // The four stripes' chunk c are adjacent in the tile: one contiguous burst per tile.
        MbarArriveExpectTx(full, stage_tx);
#pragma unroll
        for (int tile = 0; tile < (kLoadWeights ? kTiles : 0); ++tile) {
          BulkCopyG2S(st + a_offset + tile * a_tile_region,
                      tile_ptr + tile * tile_bytes + static_cast<int64_t>(c) * 4 * chunk_bytes,
                      static_cast<uint32_t>(4 * chunk_bytes), full, policy);
        }
      }
      const uint32_t b_st = st + b_offset;
      if constexpr (kWide) {
        // B [K half][token][128 bytes], 128-byte swizzle: per K half one TMA box of the block's
        // 16-row groups of valid rows (the MMA width covers them; bf16_wgmma_sm90.cuh), and one of
        // a merged tail's rows after BM. (A box per group cost the producer warp, whose issue
        // latency the 2-stage ring does not hide, up to 10 copies a stage.)
        if (kLoadTokens && lane == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            TmaLoad2D(b_st + h * token_half_bytes, act_map, c * kChunkK + h * 64, act_row, full);
            if (d.rows > BM) {
              TmaLoad2D(b_st + h * token_half_bytes + BM * 128, tail_map, c * kChunkK + h * 64,
                        tail_row, full);
            }
          }
        }
      } else if constexpr (kBf16) {
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
      } else {
        // B [unit u][row n][16 bytes]: consecutive lanes read one row's 128 contiguous bytes.
        for (int i = lane; i < d.n * 8; i += 32) {
          const int n = i >> 3;
          const int u = i & 7;
          CpAsyncCg16(b_st + u * (BM * 16) + n * 16,
                      act + static_cast<int64_t>(n) * d.k + c * kChunkK + u * 16);
        }
        // Each row's 4 scale bytes of this chunk lie in one aligned 16-byte window.
        const uint32_t s_st = b_st + BM * kChunkK;
        for (int n = lane; n < d.n; n += 32) {
          const uintptr_t a = reinterpret_cast<uintptr_t>(act_scales) +
                              static_cast<uintptr_t>(n) * scale_row + c * 4;
          CpAsyncCg16(s_st + n * 16,
                      reinterpret_cast<const void*>(a & ~static_cast<uintptr_t>(15)));
        }
      }
      fill.Advance(stages);
      if constexpr (kWide) {
        // Nothing more: lane 0's arrive.expect_tx is the stage's one arrival.
      } else if constexpr (kTmaB) {
        // Every lane, after its box if it has one (kFullArrivals): the stage is full once the
        // bytes landed.
        MbarArrive(full);
      } else if constexpr (kBf16) {
        // No proxy fence is due (mma.sync reads B with generic loads): each lane's arrival
        // completes when its copies land, without the producer coming back to the stage.
        CpAsyncMbarArrive(full);
      } else {
        asm volatile("cp.async.commit_group;" ::: "memory");
        if (++pending > kLagStages) {
          asm volatile("cp.async.wait_group %0;" ::"n"(kLagStages) : "memory");
          FenceProxyAsyncShared();
          release_oldest();
        }
      }
    }
  }
  release_all();
}

// ---- a task's end, shared by the consumers of both kernels ------------------------------------

// The fused epilogues of the task's kTiles tiles, by one warpgroup, from
// red[tile row 64 s + r][token] (`pitch` floats per row) complete and visible.
// `tile_offset`: the task's tile the first of them is (the bf16-wgmma kernel's warpgroup 1 runs
// tile 1 alone).
// `red` holds FP32 or (uint16_t) BF16 results.
template <int BM, int kTiles, bool kBf16Out, typename Red>
__device__ __forceinline__ void TaskEpilogues(const LayerParams& p, const TaskDesc& d,
                                              const Red* red, int pitch, int tile_offset = 0) {
  constexpr int64_t kActBytes = kBf16Out ? 2 : 1;  // of h_q, hs_q
  const int I = p.dims.intermediate;
  const int Is = p.dims.shared_intermediate;
  const int64_t first = static_cast<int64_t>(d.block) * BM;
#pragma unroll
  for (int s = 0; s < kTiles; ++s) {
    const Red* red_tile = red + s * kTileRows * pitch;
    auto red_at = [red_tile, pitch](int r, int n) {
      if constexpr (sizeof(Red) == 2) {
        return Bf16ToFloat(red_tile[r * pitch + n]);
      } else {
        return red_tile[r * pitch + n];
      }
    };
    const int tile = d.tile + tile_offset + s;
    switch (d.kind) {
      case kSharedW1:
        SwigluEpilogue<4, kBf16Out>(p, red_at, d.rows, tile, Is, nullptr,
                                    p.hs_q + first * Is * kActBytes, p.hs_s + first * (Is / 32));
        break;
      case kRoutedW1:
        SwigluEpilogue<4, kBf16Out>(p, red_at, d.rows, tile, I, p.meta + first,
                                    p.h_q + first * I * kActBytes, p.h_s + first * (I / 32));
        break;
      case kSharedW2:
        ScatterEpilogue<4>(p, red_at, d.rows, tile, nullptr, d.block * BM);
        break;
      default:
        ScatterEpilogue<4>(p, red_at, d.rows, tile, p.meta + first, 0);
        break;
    }
  }
}

// Thread `leader` (a warpgroup's first), once its warpgroup's stores of the task's `tiles` tiles
// are issued (after its barrier): the trace entry, and those tiles' completion: the W1 outputs to
// the block's W2 tasks, the ring slot (W1 has read it) back to role1. A task of more rows than
// the block size (the bf16-wgmma kernel's merged blocks) completes its tail block's too.
__device__ __forceinline__ void FinishTask(const LayerParams& p, const TaskDesc& d, int tiles,
                                           uint64_t start_ns, int leader = 0) {
  if (static_cast<int>(threadIdx.x) != leader) return;
  if (p.task_trace != nullptr && d.task < p.task_trace_cap) {
    p.task_trace[d.task].start_ns = start_ns;
    p.task_trace[d.task].done_ns = GlobalTimerNs();
  }
  if (d.kind == kRoutedW1) {
    __threadfence();
    RedAddReleaseGpu(&p.w1_done[d.block], tiles);
    RedAddReleaseGpu(&p.ring_empty[d.block % p.ring_blocks], tiles);
    if (d.rows > p.bm) {
      RedAddReleaseGpu(&p.w1_done[d.block + 1], tiles);
      RedAddReleaseGpu(&p.ring_empty[(d.block + 1) % p.ring_blocks], tiles);
    }
  } else if (d.kind == kSharedW1) {
    __threadfence();
    RedAddReleaseGpu(&p.w1s_done[d.block], tiles);
  }
}

// Waits for task descriptor `desc_iter` and hands its slot back (every consumer thread reads it).
__device__ __forceinline__ TaskDesc TakeDescriptor(Barriers& bars, uint32_t desc_iter,
                                                   uint64_t mbar_timeout, const WaitEnv& env) {
  const int ds = desc_iter % kDescSlots;
  MbarWait(SmemAddr(&bars.desc_full[ds]), (desc_iter / kDescSlots) & 1, mbar_timeout, env,
           2 * kMaxStages + ds);
  const TaskDesc d = bars.desc[ds];
  MbarArrive(SmemAddr(&bars.desc_empty[ds]));
  return d;
}

// ---- consumers --------------------------------------------------------------------------------

template <int BM, GemmKernel kKernel>
__device__ void Consumers(const LayerParams& p, uint8_t* stage_base, int stages, int stage_bytes,
                          float* red_buffer, Barriers& bars) {
  constexpr int kTiles = Role2TilesPerTask(kKernel, BM);
  constexpr int kAcc = kTiles * BM / 2;  // per tile s: acc[s * BM / 2 ..]
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int Is = p.dims.shared_intermediate;
  const int a_region = kTiles * ARegionBytes(Is > 0);  // B follows the task's tiles
  const bool red_in_stage = RedInStage(kKernel, BM, Is > 0);
  const uint64_t mbar_timeout = 2 * p.timeout_ns + 1000000000ull;
  const WaitEnv env = MakeWaitEnv(p, 2);
  RingCursor ring;
  for (uint32_t desc_iter = 0;; ++desc_iter) {
    const TaskDesc d = TakeDescriptor(bars, desc_iter, mbar_timeout, env);
    if (d.kind < 0) break;
    const uint64_t start_ns = p.task_trace != nullptr ? GlobalTimerNs() : 0;

    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    if (d.kind == kRoutedW1 || d.kind == kRoutedW2) {
      RunMainloop<BM, true, kKernel>(d, stage_base, stages, stage_bytes, a_region, bars,
                                     mbar_timeout, env, acc, ring, d.kind == kRoutedW2,
                                     red_in_stage);
    } else {
      RunMainloop<BM, false, kKernel>(d, stage_base, stages, stage_bytes, a_region, bars,
                                      mbar_timeout, env, acc, ring, d.kind == kSharedW2,
                                      red_in_stage);
    }
    // RedInStage: the results go over the task's last stage, once every consumer is done with it.
    const int held = ring.stage == 0 ? stages - 1 : ring.stage - 1;
    float* red =
        red_in_stage
            ? reinterpret_cast<float*>(stage_base + static_cast<int64_t>(held) * stage_bytes)
            : red_buffer;
    if (red_in_stage) NamedBarrier(kConsumerBarrierId, kConsumerThreads);
    if (d.scale_shift != 0) {
      const float undo = FloatFromBits(static_cast<uint32_t>(127 + d.scale_shift) << 23);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] *= undo;  // exact: a power of two
    }

    // The tiles' results to shared memory: red[tile s row 0..63 at 64 s + row][token].
#pragma unroll
    for (int s = 0; s < kTiles; ++s) {
      const int row = s * kTileRows + warp * 16 + g;
#pragma unroll
      for (int j = 0; j < BM / 8; ++j) {
        const int col = 8 * j + 2 * t;
        const float* a = &acc[s * BM / 2 + 4 * j];
        red[row * RedPitch(BM) + col] = a[0];
        red[row * RedPitch(BM) + col + 1] = a[1];
        red[(row + 8) * RedPitch(BM) + col] = a[2];
        red[(row + 8) * RedPitch(BM) + col + 1] = a[3];
      }
    }
    NamedBarrier(kConsumerBarrierId, kConsumerThreads);  // red complete
    TaskEpilogues<BM, kTiles, kKernel == GemmKernel::kStreamBf16>(p, d, red, RedPitch(BM));
    // Every consumer's stores of the task are issued and red may be overwritten. bar.sync is
    // CTA-scope synchronization and the release below is cumulative, so thread 0's release
    // covers the other consumers' W1 outputs.
    NamedBarrier(kConsumerBarrierId, kConsumerThreads);
    if (red_in_stage) {
      FenceProxyAsyncShared();  // behind this thread's accesses of the stage (the refill)
      MbarArrive(SmemAddr(&bars.empty[held]));
    }
    FinishTask(p, d, kTiles, start_ns);
  }
  // Partials scattered into peers' combine buffers must have reached them before role3 (a
  // later kernel) announces them; a kernel boundary does not order stores to another GPU.
  if (p.dims.world_size > 1) __threadfence_system();
}

// ---- the bf16-wgmma kernel (BM 64: bf16_wgmma_sm90.cuh) --------------------------------------

// Warpgroup `group` (threads 128 group ..) of the consumers: tile `group` of every task.
template <bool kShared, bool kMerge>
__device__ void WideConsumers(const LayerParams& p, uint8_t* stage_base, int stages,
                              int stage_bytes, Barriers& bars) {
  const int group = threadIdx.x / kConsumerThreads;
  constexpr int a_tile_region = ARegionBytes(kShared);
  constexpr int token_half_bytes = WideTokenHalfBytes(kShared);
  const uint64_t mbar_timeout = 2 * p.timeout_ns + 1000000000ull;
  const WaitEnv env = MakeWaitEnv(p, 2);
  const uint32_t barrier = kConsumerBarrierId + 1 + group;  // this warpgroup's own
  RingCursor ring;
  for (uint32_t desc_iter = 0;; ++desc_iter) {
    const TaskDesc d = TakeDescriptor(bars, desc_iter, mbar_timeout, env);
    if (d.kind < 0) break;
    const uint64_t start_ns = p.task_trace != nullptr ? GlobalTimerNs() : 0;
    uint16_t* red_tile =
        d.kind == kRoutedW1 || d.kind == kRoutedW2
            ? RunWideTask<true, kMerge>(d, stage_base, stages, stage_bytes, a_tile_region, bars,
                                        mbar_timeout, env, ring, group, token_half_bytes)
            : RunWideTask<false, kMerge>(d, stage_base, stages, stage_bytes, a_tile_region, bars,
                                         mbar_timeout, env, ring, group, token_half_bytes);
    const int held = ring.stage == 0 ? stages - 1 : ring.stage - 1;  // the stage red is over
    NamedBarrier(barrier, kConsumerThreads);                         // red complete
    TaskEpilogues<kWideBm, 1, true>(p, d, red_tile, kWideRedPitch, group);
    // Every store of the warpgroup's tile is issued and its red is read: the stage goes back.
    NamedBarrier(barrier, kConsumerThreads);
    FenceProxyAsyncShared();  // behind this thread's accesses of the stage (the refill)
    MbarArrive(SmemAddr(&bars.empty[held]));
    FinishTask(p, d, 1, start_ns, group * kConsumerThreads);
  }
  if (p.dims.world_size > 1) __threadfence_system();
}

// One instance per stage layout: with or without the shared expert (WideTokenRows), so that the
// token rows' extent is a constant of the K loop (as a runtime value it cost 1-2 %). Without the
// shared expert also one without merged tails (kMerge), for steps that have none: the N = 80
// path's registers cost the other loops 0.5-2.7 % (docs/PERFORMANCE.md, session 13).
template <bool kShared, bool kMerge>
__global__ void __launch_bounds__(kWideThreads, kWideMaxCtasPerSm)
    GroupedGemmWgmmaBf16Kernel(const __grid_constant__ LayerParams p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // The swizzled layout needs 1024-aligned atoms (WideSmemBytes reserves the slack).
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  const int stages = p.r2_stages;
  constexpr int stage_bytes = WideStageBytes(kShared);
  Barriers& bars = *reinterpret_cast<Barriers*>(smem + static_cast<size_t>(stages) * stage_bytes);
  if constexpr (kRole2Probe.no_tokens || kRole2Probe.no_weights) {
    // What a probe does not load is zeros, so that the outputs stay finite.
    for (int i = threadIdx.x; i < stages * stage_bytes / 4; i += blockDim.x) {
      reinterpret_cast<uint32_t*>(smem)[i] = 0;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (p.smid_log != nullptr) p.smid_log[p.role1_grid + blockIdx.x] = SmId();
    for (int s = 0; s < stages; ++s) {
      MbarInit(SmemAddr(&bars.full[s]), 1);  // the producer's arrive.expect_tx
      MbarInit(SmemAddr(&bars.empty[s]), kWideConsumers);
    }
    for (int i = 0; i < kDescSlots; ++i) {
      MbarInit(SmemAddr(&bars.desc_full[i]), 1);
      MbarInit(SmemAddr(&bars.desc_empty[i]), kWideConsumers);
    }
    FenceMbarInit();
  }
  __syncthreads();
  if (threadIdx.x >= kWideConsumers) {
    Producer<kWideBm, GemmKernel::kStreamBf16, true, kShared, kMerge>(p, smem, stages, stage_bytes,
                                                                      bars);
  } else {
    WideConsumers<kShared, kMerge>(p, smem, stages, stage_bytes, bars);
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");  // as GroupedGemmStreamKernel
}

// Register cap: each of an SM's 4 schedulers owns a quarter of the register file and a CTA's
// 5 warps spread over them, so TargetCtasPerSm CTAs fit only at <= 96 (4 CTAs), 128 (3) or
// 168 (2) registers. Given as __maxnreg__: the launch-bounds form derives the same caps but
// its code for BM 8 ran 7% slower at 8-16 tokens per rank (measured, H200, 2026-11-29).
__host__ __device__ constexpr int MaxRegisters(GemmKernel kernel, int bm) {
  return 65536 / 4 / ((TargetCtasPerSm(kernel, bm) * (kStreamThreads / 32) + 3) / 4) / 32 / 8 * 8;
}
template <int BM, GemmKernel kKernel>
__global__ void __launch_bounds__(kStreamThreads) __maxnreg__(MaxRegisters(kKernel, BM))
    GroupedGemmStreamKernel(const __grid_constant__ LayerParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int stages = p.r2_stages;
  const bool has_shared = p.dims.shared_intermediate > 0;
  const int stage_bytes = StageBytes(kKernel, BM, has_shared);
  // The results buffer after the stages, unless the results go over a stage (RedInStage).
  float* red = reinterpret_cast<float*>(smem + static_cast<size_t>(stages) * stage_bytes);
  Barriers& bars = *reinterpret_cast<Barriers*>(
      reinterpret_cast<uint8_t*>(red) +
      (RedInStage(kKernel, BM, has_shared) ? 0 : RedBytes(kKernel, BM)));
  if (threadIdx.x == 0) {
    if (p.smid_log != nullptr) p.smid_log[p.role1_grid + blockIdx.x] = SmId();
    for (int s = 0; s < stages; ++s) {
      MbarInit(SmemAddr(&bars.full[s]), kFullArrivals);
      MbarInit(SmemAddr(&bars.empty[s]), kConsumerThreads);
    }
    for (int i = 0; i < kDescSlots; ++i) {
      MbarInit(SmemAddr(&bars.desc_full[i]), 1);
      MbarInit(SmemAddr(&bars.desc_empty[i]), kConsumerThreads);
    }
    FenceMbarInit();
  }
  __syncthreads();
  if (threadIdx.x >= kConsumerThreads) {
    Producer<BM, kKernel>(p, smem, stages, stage_bytes, bars);
  } else {
    Consumers<BM, kKernel>(p, smem, stages, stage_bytes, red, bars);
  }
  // Launched early behind role1 (LaunchStreamGemmRole2's `early`), this grid must not end
  // before role1 has: role3, next in the stream, resets what role1 may still be using. A no-op
  // otherwise.
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

using StreamKernel = void (*)(LayerParams);

template <GemmKernel kKernel>
StreamKernel KernelFor(int bm) {
  switch (bm) {
    case 8:
      return GroupedGemmStreamKernel<8, kKernel>;
    case 16:
      return GroupedGemmStreamKernel<16, kKernel>;
    case 32:
      return GroupedGemmStreamKernel<32, kKernel>;
    case 64:
      return GroupedGemmStreamKernel<64, kKernel>;
    default:
      return nullptr;
  }
}

// The streaming kernels: every GemmKernel but the stepping stone.
constexpr GemmKernel kStreamKernels[] = {GemmKernel::kStreamMma, GemmKernel::kStreamWgmma,
                                         GemmKernel::kStreamBf16, GemmKernel::kWgmmaBf16};

// has_shared: the layer has the shared expert (the bf16-wgmma kernel has an instance for each);
// merge_tails: the bf16-wgmma kernel's instance that runs merged tails (without the shared expert).
StreamKernel KernelFor(GemmKernel kernel, int bm, bool has_shared, bool merge_tails) {
  switch (kernel) {
    case GemmKernel::kStreamMma:
      return KernelFor<GemmKernel::kStreamMma>(bm);
    case GemmKernel::kStreamWgmma:
      return KernelFor<GemmKernel::kStreamWgmma>(bm);
    case GemmKernel::kStreamBf16:
      return KernelFor<GemmKernel::kStreamBf16>(bm);
    case GemmKernel::kWgmmaBf16:
      if (bm != kWideBm) return KernelFor<GemmKernel::kStreamBf16>(bm);
      if (has_shared) return GroupedGemmWgmmaBf16Kernel<true, false>;
      return merge_tails ? GroupedGemmWgmmaBf16Kernel<false, true>
                         : GroupedGemmWgmmaBf16Kernel<false, false>;
    default:
      return nullptr;
  }
}

}  // namespace

cudaError_t LoadStreamGemmKernels() {
  for (int bm : kBlockSizes) {
    for (GemmKernel which : kStreamKernels) {
      for (int variant = 0; variant < 4; ++variant) {
        const StreamKernel kernel = KernelFor(which, bm, variant & 1, variant & 2);
        cudaFuncAttributes attributes;
        cudaError_t err = cudaFuncGetAttributes(&attributes, kernel);
        if (err == cudaSuccess) {
          err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kSmemPerSm - kSmemReservedPerCta));
        }
        // The whole unified L1/shared array as shared memory: the stage rings of
        // TargetCtasPerSm CTAs need it (the default carveout fit one CTA fewer at BM 32 and 64).
        if (err == cudaSuccess) {
          err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared);
        }
        if (err != cudaSuccess) return err;
      }
    }
  }
  return cudaSuccess;
}

cudaError_t StreamGemmShape(const LayerDims& dims, GemmKernel which, int bm, Role2Shape* shape) {
  const bool has_shared = dims.shared_intermediate > 0;
  const StreamKernel kernel = KernelFor(which, bm, has_shared, true);
  if (kernel == nullptr) return cudaErrorInvalidValue;
  const bool wide = which == GemmKernel::kWgmmaBf16 && bm == kWideBm;
  // Below BM 64 `bf16-wgmma` runs the bf16 kernels.
  if (which == GemmKernel::kWgmmaBf16) which = GemmKernel::kStreamBf16;
  // As many stages as fit the shared memory of TargetCtasPerSm resident CTAs (the bf16-wgmma
  // kernel: of WideCtasPerSm).
  int stages = wide ? WideStages(has_shared)
                    : StagesFitting(which, bm, has_shared, RedInStage(which, bm, has_shared));
  const int min_stages = wide ? kWideMinStages : kMinStages;
  stages = stages < min_stages ? min_stages : (stages > kMaxStages ? kMaxStages : stages);
  if (wide && kRole2Probe.stages >= kWideMinStages && kRole2Probe.stages < stages) {
    stages = kRole2Probe.stages;
  }
  shape->threads = wide ? kWideThreads : kStreamThreads;
  shape->stages = stages;
  shape->smem_bytes =
      wide ? WideSmemBytes(has_shared, stages) : StreamSmemBytes(which, bm, has_shared, stages);
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&shape->blocks_per_sm, kernel,
                                                       shape->threads, shape->smem_bytes);
}

cudaError_t LaunchStreamGemmRole2(const LayerParams& params, GemmKernel which,
                                  const Role2Shape& shape, int grid, cudaStream_t stream,
                                  bool early, bool merge_tails) {
  const StreamKernel kernel =
      KernelFor(which, params.bm, params.dims.shared_intermediate > 0, merge_tails);
  if (kernel == nullptr || params.r2_stages != shape.stages) return cudaErrorInvalidValue;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(static_cast<unsigned>(shape.threads));
  config.dynamicSmemBytes = shape.smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (early) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, params);
}

}  // namespace gcmoe::kernels
