// role2: the grouped GEMM of a GC-MoE layer on the compute partition (DESIGN.md §4 steps 2-4).
//
// Stepping stone, kept selectable (GCMOE_CUDA_GEMM=mma): the paper's structure (operand swap:
// weights are the MMA's M side, tokens its N side; FP4 decoded to E4M3 in registers; per-32
// block scales applied outside the MMA) on warp-level mma.sync.m16n8k32 E4M3, every warp
// streaming its own weights through cp.async. The default role2 is the warp-specialized
// kernel of grouped_gemm_wgmma_fp8_fp4_sm90.cu (its mma.sync variant).
//
// A task is one 64-row weight tile against one block of BM tokens:
//   shared W1, routed W1: 32 SwiGLU features of the block (gate and up rows of one tile),
//                         requantized to E4M3 per 32 (one scale block of h);
//   shared W2, routed W2: 64 hidden features of the block, BF16 partials scattered to the
//                         source rank's combine buffer at (token, slot).
// CTAs claim tasks in that order from one cursor, so a W2 task is claimed only after every W1
// task of its block was claimed by a running CTA: its wait cannot deadlock.
//
// Warp w of 8 owns stripe (16 weight rows) w % 4 and half w / 4 of the contraction; weights
// stream through a per-warp cp.async ring of 128-K chunks (each lane copies and reads back only
// its own bytes, so no barrier guards the ring); activations come from L2.
#include <cstdint>

#include "kernels/device_common.cuh"
#include "kernels/gemm_epilogue_sm90.cuh"
#include "kernels/layer_roles.h"
#include "kernels/role2_tasks_sm90.cuh"
#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::kernels {
namespace {

constexpr int kWarps = kRoleThreads / 32;
constexpr int kStages = 4;
// Largest chunk payload (E4M3) plus one 8-byte scale copy per lane.
constexpr int kStageBytes = 2048 + 32 * 8;
constexpr int kStageScaleOffset = 2048;

__host__ __device__ constexpr int RedPitch(int nt) { return 8 * nt + 1; }
__host__ __device__ constexpr size_t GemmSmemBytes(int nt) {
  return static_cast<size_t>(kWarps) * kStages * kStageBytes +
         static_cast<size_t>(2) * kTileRows * RedPitch(nt) * sizeof(float);
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void CpAsync8(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// D = A (16x32 E4M3, row) x B (32x8 E4M3, col), fresh accumulator: one scale block's dot
// products, scaled by the caller.
__device__ __forceinline__ void MmaE4m3(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1, float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

struct GemmOperand {
  const uint8_t* tile;        // the task's 64-row weight tile (4 stripes)
  const uint8_t* act;         // [rows, k] E4M3 activations of the block's first row
  const uint8_t* act_scales;  // [rows, k/32] UE8M0
  int k;                      // contraction
  int rows;                   // valid tokens, 1..BM
};

// acc[nt][0..3] = this warp's share of the tile's dot products for the C fragment of n-tile nt
// (rows g, g+8 of its stripe; tokens 2t, 2t+1 of the n-tile), over its half of the contraction.
template <int NT, bool kFp4>
__device__ __forceinline__ void TileMainloop(const GemmOperand& op, uint8_t* stages,
                                             float (&acc)[NT][4]) {
  constexpr TileFormat kFormat = kFp4 ? TileFormat::kE2M1 : TileFormat::kE4M3;
  constexpr int kPayload = ChunkPayloadBytes(kFormat);
  constexpr int kPieces = kPayload / 512;
  constexpr int kChunkBytes = ChunkBytes(kFormat);
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int stripe = warp & 3;
  const int half = warp >> 2;
  const int chunks = op.k / kChunkK;
  const int mid = (chunks + 1) / 2;
  const int c_begin = half == 0 ? 0 : mid;
  const int n_chunks = (half == 0 ? mid : chunks) - c_begin;
  const int scale_row_bytes = op.k / 32;
  // Chunk c of this stripe: (c * 4 + stripe) chunks into the tile (chunk-major tiles).
  const uint8_t* src = op.tile + (static_cast<int64_t>(c_begin) * 4 + stripe) * kChunkBytes;

#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.0f;
  }

  auto issue = [&](int i) {
    const uint8_t* chunk = src + static_cast<int64_t>(i) * 4 * kChunkBytes;
    uint8_t* dst = stages + (i % kStages) * kStageBytes;
#pragma unroll
    for (int p = 0; p < kPieces; ++p)
      CpAsync16(dst + p * 512 + lane * 16, chunk + p * 512 + lane * 16);
    CpAsync8(dst + kStageScaleOffset + lane * 8, chunk + kPayload + g * 8);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_chunks) issue(s);
    CpAsyncCommit();
  }

  // Activation fragments and scales of chunk i (L2). Rows past the block's end read its last
  // row: finite data whose columns are discarded.
  auto load_acts = [&](int i, uint2(&b)[NT][4], uint32_t(&sx_lo)[NT], uint32_t(&sx_hi)[NT]) {
    const int k0 = (c_begin + i) * kChunkK;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt * 8 < op.rows) {
        const int rb = min(nt * 8 + g, op.rows - 1);
        // b0: logical positions 4t..4t+3 of the scale block, b1: 16+4t.. (the tile order).
        const uint8_t* row = op.act + static_cast<int64_t>(rb) * op.k + k0 + 4 * t;
#pragma unroll
        for (int kb = 0; kb < 4; ++kb)
          b[nt][kb] = make_uint2(LdCg32(row + kb * 32), LdCg32(row + kb * 32 + 16));
        const int r0 = min(nt * 8 + 2 * t, op.rows - 1);
        const int r1 = min(nt * 8 + 2 * t + 1, op.rows - 1);
        sx_lo[nt] = LdCg32(op.act_scales + static_cast<int64_t>(r0) * scale_row_bytes + k0 / 32);
        sx_hi[nt] = LdCg32(op.act_scales + static_cast<int64_t>(r1) * scale_row_bytes + k0 / 32);
      }
    }
  };
  // With few tokens the chunk loop is latency-bound: the next chunk's activations are loaded
  // while this one computes (the registers this costs are affordable only for small NT).
  constexpr bool kPrefetch = NT <= 2;
  uint2 b[NT][4];
  uint32_t sx_lo[NT];
  uint32_t sx_hi[NT];
  if (kPrefetch && n_chunks > 0) load_acts(0, b, sx_lo, sx_hi);

  for (int i = 0; i < n_chunks; ++i) {
    if (i + kStages - 1 < n_chunks) issue(i + kStages - 1);
    CpAsyncCommit();
    uint2 b_next[NT][4];
    uint32_t sx_lo_next[NT];
    uint32_t sx_hi_next[NT];
    if constexpr (kPrefetch) {
      if (i + 1 < n_chunks) load_acts(i + 1, b_next, sx_lo_next, sx_hi_next);
    } else {
      load_acts(i, b, sx_lo, sx_hi);  // issued before waiting on the weights
    }

    CpAsyncWait<kStages - 1>();  // this lane's copies of chunk i have landed
    const uint8_t* stage = stages + (i % kStages) * kStageBytes;
    uint32_t w[kPieces * 4];
    LoadLaneWords<kPieces>(stage, lane, w);
    const uint2 sw = *reinterpret_cast<const uint2*>(stage + kStageScaleOffset + lane * 8);

#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint32_t a0, a1, a2, a3;
      if constexpr (kFp4) {
        // E4M3 codes of the values times 2^-6 (weight_tiles_sm90.h): paid after the loop.
        const E4m3Pair row_g = DecodeE2m1Word(w[kb * 2]);
        const E4m3Pair row_g8 = DecodeE2m1Word(w[kb * 2 + 1]);
        a0 = row_g.lo;
        a2 = row_g.hi;
        a1 = row_g8.lo;
        a3 = row_g8.hi;
      } else {
        a0 = w[kb * 4 + 0];
        a2 = w[kb * 4 + 1];
        a1 = w[kb * 4 + 2];
        a3 = w[kb * 4 + 3];
      }
      const uint32_t sw_word = kb < 2 ? sw.x : sw.y;
      const float scale_g = WeightScale(sw_word, (kb & 1) * 2);
      const float scale_g8 = WeightScale(sw_word, (kb & 1) * 2 + 1);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (nt * 8 < op.rows) {
          float d[4];
          MmaE4m3(a0, a1, a2, a3, b[nt][kb].x, b[nt][kb].y, d);
          const float sx0 = ActivationScale(sx_lo[nt], kb);
          const float sx1 = ActivationScale(sx_hi[nt], kb);
          // Products of powers of two: exact, so this is the sum of the exactly scaled
          // products, only in another order than the CPU's.
          acc[nt][0] = fmaf(d[0], scale_g * sx0, acc[nt][0]);
          acc[nt][1] = fmaf(d[1], scale_g * sx1, acc[nt][1]);
          acc[nt][2] = fmaf(d[2], scale_g8 * sx0, acc[nt][2]);
          acc[nt][3] = fmaf(d[3], scale_g8 * sx1, acc[nt][3]);
        }
      }
    }
    if constexpr (kPrefetch) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) b[nt][kb] = b_next[nt][kb];
        sx_lo[nt] = sx_lo_next[nt];
        sx_hi[nt] = sx_hi_next[nt];
      }
    }
  }
  CpAsyncWait<0>();
  if constexpr (kFp4) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[nt][i] *= kE2m1DecodeScale;  // exact: a power of two
    }
  }
}

// The tile's FP32 results, both contraction halves: red[half][row 0..63][token].
template <int NT, bool kFp4>
__device__ __forceinline__ void TileGemm(const GemmOperand& op, uint8_t* smem, float* red) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  float acc[NT][4];
  TileMainloop<NT, kFp4>(op, smem + warp * kStages * kStageBytes, acc);
  const int row = (warp >> 2) * kTileRows + (warp & 3) * 16 + g;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int col = nt * 8 + 2 * t;
    red[row * RedPitch(NT) + col] = acc[nt][0];
    red[row * RedPitch(NT) + col + 1] = acc[nt][1];
    red[(row + 8) * RedPitch(NT) + col] = acc[nt][2];
    red[(row + 8) * RedPitch(NT) + col + 1] = acc[nt][3];
  }
}

template <int NT>
__global__ void __launch_bounds__(kRoleThreads, NT <= 4 ? 2 : 1)
    GroupedGemmRole2Kernel(const __grid_constant__ LayerParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  float* red = reinterpret_cast<float*>(smem + static_cast<size_t>(kWarps) * kStages * kStageBytes);
  __shared__ int s_task;
  __shared__ int s_go;
  constexpr int BM = 8 * NT;

  if (p.smid_log != nullptr && threadIdx.x == 0) p.smid_log[p.role1_grid + blockIdx.x] = SmId();
  const StepHeader& hdr = *p.header;
  const WaitEnv env = MakeWaitEnv(p, 2);
  const int T = hdr.num_tokens;
  const int H = p.dims.hidden;
  const int I = p.dims.intermediate;
  const int Is = p.dims.shared_intermediate;
  const int nb = hdr.num_blocks;
  const int nsb = hdr.num_shared_blocks;
  const int n1 = I / 32;         // routed W1 tiles per block
  const int n1s = Is / 32;       // shared W1 tiles per block
  const int n2 = H / kTileRows;  // W2 tiles per block (routed and shared)
  const Role2TaskSpace tasks(nb, nsb, n1, n1s, n2);

  for (;;) {
    if (threadIdx.x == 0) s_task = static_cast<int>(atomicAdd(&p.sig->task_next, 1u));
    const uint64_t claim_ns = p.task_trace != nullptr ? GlobalTimerNs() : 0;
    __syncthreads();
    const int64_t task = s_task;
    if (task >= tasks.total) break;
    const auto [kind, block, tile] = tasks.Decode(task);
    const int slot = block % p.ring_blocks;
    const bool traced = p.task_trace != nullptr && task < p.task_trace_cap;
    // Wait (one thread, acquire) for what the task reads, then broadcast through the barrier.
    if (threadIdx.x == 0) {
      bool ok = true;
      switch (kind) {
        case kSharedW1:
          ok = WaitAtLeast(env, &p.sig->x_ready, 1, false, kWaitXReady, block);
          break;
        case kRoutedW1:
          ok = WaitAtLeast(env, &p.ring_full[slot],
                           RingFullTarget(block, p.ring_blocks, PullParts(nb, p.role1_grid)), false,
                           kWaitRingFull, block);
          break;
        case kSharedW2:
          ok = WaitAtLeast(env, &p.w1s_done[block], n1s, false, kWaitSharedW1Done, block);
          break;
        case kRoutedW2:
          ok = WaitAtLeast(env, &p.w1_done[block], n1, false, kWaitW1Done, block);
          break;
      }
      s_go = ok;
      if (traced) {
        TaskTrace& t = p.task_trace[task];
        t.cta = blockIdx.x, t.sm = SmId(), t.kind = kind, t.recorded = 1;
        t.claim_ns = claim_ns, t.ready_ns = t.start_ns = GlobalTimerNs();
      }
    }
    __syncthreads();
    if (!s_go) break;

    GemmOperand op;
    const RingBlock blk = kind == kRoutedW1 || kind == kRoutedW2 ? p.blocks[block] : RingBlock{};
    const int shared_rows = min(BM, T - block * BM);
    switch (kind) {
      case kSharedW1:
        op = {hdr.ws1 + tile * TileBytes(TileFormat::kE4M3, H),
              p.x_q + static_cast<int64_t>(block) * BM * H,
              p.x_s + static_cast<int64_t>(block) * BM * (H / 32), H, shared_rows};
        TileGemm<NT, false>(op, smem, red);
        break;
      case kRoutedW1:
        op = {hdr.w1 + (static_cast<int64_t>(blk.local_slot) * n1 + tile) *
                           TileBytes(TileFormat::kE2M1, H),
              p.ring + static_cast<int64_t>(slot) * BM * H,
              p.ring_scales + static_cast<int64_t>(slot) * BM * (H / 32), H, blk.rows};
        TileGemm<NT, true>(op, smem, red);
        break;
      case kSharedW2:
        op = {hdr.ws2 + tile * TileBytes(TileFormat::kE4M3, Is),
              p.hs_q + static_cast<int64_t>(block) * BM * Is,
              p.hs_s + static_cast<int64_t>(block) * BM * (Is / 32), Is, shared_rows};
        TileGemm<NT, false>(op, smem, red);
        break;
      case kRoutedW2:
        op = {hdr.w2 + (static_cast<int64_t>(blk.local_slot) * n2 + tile) *
                           TileBytes(TileFormat::kE2M1, I),
              p.h_q + static_cast<int64_t>(block) * BM * I,
              p.h_s + static_cast<int64_t>(block) * BM * (I / 32), I, blk.rows};
        TileGemm<NT, true>(op, smem, red);
        break;
    }
    __syncthreads();  // red complete

    // Both contraction halves of a result, summed, as BF16 (the epilogues read a = BF16(W x)).
    auto red_at = [red](int row, int col) {
      return RoundBf16(red[row * RedPitch(NT) + col] + red[(kTileRows + row) * RedPitch(NT) + col]);
    };
    switch (kind) {
      case kSharedW1:
        SwigluEpilogue<kWarps>(p, red_at, op.rows, tile, Is, nullptr,
                               p.hs_q + static_cast<int64_t>(block) * BM * Is,
                               p.hs_s + static_cast<int64_t>(block) * BM * (Is / 32));
        break;
      case kRoutedW1:
        SwigluEpilogue<kWarps>(p, red_at, op.rows, tile, I,
                               p.meta + static_cast<int64_t>(block) * BM,
                               p.h_q + static_cast<int64_t>(block) * BM * I,
                               p.h_s + static_cast<int64_t>(block) * BM * (I / 32));
        break;
      case kSharedW2:
        ScatterEpilogue<kWarps>(p, red_at, op.rows, tile, nullptr, block * BM);
        break;
      case kRoutedW2:
        ScatterEpilogue<kWarps>(p, red_at, op.rows, tile, p.meta + static_cast<int64_t>(block) * BM,
                                0);
        break;
    }
    __syncthreads();  // every store of the task issued; red may be overwritten
    if (threadIdx.x == 0 && traced) p.task_trace[task].done_ns = GlobalTimerNs();
    // Release the task's completion: the W1 outputs to the block's W2 tasks, the ring slot
    // (W1 has read it) back to role1. __syncthreads above orders all threads' stores before
    // thread 0's release (bar.sync is CTA-scope synchronization, the release is cumulative).
    if (threadIdx.x == 0) {
      if (kind == kRoutedW1) {
        __threadfence();
        RedAddReleaseGpu(&p.w1_done[block], 1);
        RedAddReleaseGpu(&p.ring_empty[slot], 1);
      } else if (kind == kSharedW1) {
        __threadfence();
        RedAddReleaseGpu(&p.w1s_done[block], 1);
      }
    }
  }
  // Partials scattered into peers' combine buffers must have reached them before role3 (a
  // later kernel) announces them; a kernel boundary does not order stores to another GPU.
  if (p.dims.world_size > 1) __threadfence_system();
}

template <int NT>
cudaError_t Configure() {
  cudaFuncAttributes attributes;
  cudaError_t err = cudaFuncGetAttributes(&attributes, GroupedGemmRole2Kernel<NT>);
  if (err != cudaSuccess) return err;
  return cudaFuncSetAttribute(GroupedGemmRole2Kernel<NT>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(GemmSmemBytes(NT)));
}

}  // namespace

size_t Role2SmemBytes(int block_rows) { return GemmSmemBytes(block_rows / 8); }

cudaError_t LoadGroupedGemmKernels() {
  cudaError_t err;
  if ((err = Configure<1>()) != cudaSuccess) return err;
  if ((err = Configure<2>()) != cudaSuccess) return err;
  if ((err = Configure<4>()) != cudaSuccess) return err;
  return Configure<8>();
}

cudaError_t Role2BlocksPerSm(int block_rows, int* blocks_per_sm) {
  const size_t smem = GemmSmemBytes(block_rows / 8);
  switch (block_rows) {
    case 8:
      return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, GroupedGemmRole2Kernel<1>,
                                                           kRoleThreads, smem);
    case 16:
      return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, GroupedGemmRole2Kernel<2>,
                                                           kRoleThreads, smem);
    case 32:
      return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, GroupedGemmRole2Kernel<4>,
                                                           kRoleThreads, smem);
    case 64:
      return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, GroupedGemmRole2Kernel<8>,
                                                           kRoleThreads, smem);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchMmaSyncGemmRole2(const LayerParams& params, int grid, cudaStream_t stream) {
  const size_t smem = GemmSmemBytes(params.bm / 8);
  switch (params.bm) {
    case 8:
      GroupedGemmRole2Kernel<1><<<grid, kRoleThreads, smem, stream>>>(params);
      break;
    case 16:
      GroupedGemmRole2Kernel<2><<<grid, kRoleThreads, smem, stream>>>(params);
      break;
    case 32:
      GroupedGemmRole2Kernel<4><<<grid, kRoleThreads, smem, stream>>>(params);
      break;
    case 64:
      GroupedGemmRole2Kernel<8><<<grid, kRoleThreads, smem, stream>>>(params);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace gcmoe::kernels
