// role2 on Hopper: the grouped GEMM of a GC-MoE layer (DESIGN.md §4 steps 2-4, §6), warp-
// specialized so that weight streaming never waits on arithmetic, with exact BF16 operands
// (layer_roles.h).
//
// A task is one or two adjacent 64-row weight tiles (weight_tiles_sm90.h, Role2TilesPerTask)
// against one block of tokens: shared W1, routed W1, shared W2, routed W2, claimed in that order
// from one cursor, so a W2 task is claimed only after every W1 task of its block was claimed by
// a running CTA and its wait cannot deadlock.
//
// BM 8, 16, 32: CTA = one consumer warpgroup (warps 0-3) + one producer warp (warp 4).
//   producer: claims a task, waits for what it reads (ring block full / W1 tiles done; the
//     weights depend on nothing), publishes a task descriptor, then streams the task's K128
//     steps into a ring of shared-memory stages: each tile's four stripe chunks as one bulk copy
//     (one contiguous burst, evict-first in L2) and the block's BF16 activation rows (TMA boxes
//     from BM 16 on, cp.async at BM 8), all completing on the stage's `full` barrier. The ring
//     spans task boundaries, so the next task's weights stream during this task's epilogue.
//   consumers: per stage, the FP4 (or the shared expert's E4M3) weights are decoded to BF16
//     times their block scale in registers and mma.sync m16n8k16 BF16 sums the whole K in FP32
//     (stream_mainloops_sm90.cuh); then the fused epilogue (SwiGLU + routing weight + E4M3
//     requantization of h, stored as the exact BF16 rows W2 reads, or the BF16 scatter to the
//     combine buffer).
//   valid-M sizing: the MMA width n is the smallest of 8, 16, 32, 64 covering the block's rows,
//     so a partially filled block streams and multiplies fewer token columns.
// BM 64: two consumer warpgroups on register-A BF16 wgmma (one tile of the task each), three
//   CTAs per SM; its CTA is below and its K loop in bf16_wgmma_sm90.cuh.
//
// The pipeline's layout and invariants: stream_pipeline_sm90.cuh; the producer warp:
// stream_producer_sm90.cuh.
#include <cstdint>

#include "kernels/bf16_wgmma_sm90.cuh"
#include "kernels/device_common.cuh"
#include "kernels/gemm_epilogue_sm90.cuh"
#include "kernels/layer_roles.h"
#include "kernels/programmatic_launch.h"
#include "kernels/sm90_async.cuh"
#include "kernels/stream_mainloops_sm90.cuh"
#include "kernels/stream_pipeline_sm90.cuh"
#include "kernels/stream_producer_sm90.cuh"

namespace gcmoe::kernels {
namespace {

using namespace stream_role2;  // the pipeline and K loops of this kernel, in their own headers

// ---- a task's end, shared by the consumers of both kernels ------------------------------------

// The fused epilogues of the task's kTiles tiles, by one warpgroup, from
// red[tile row 64 s + r][token] (`pitch` values per row) complete and visible.
// `tile_offset`: the task's tile the first of them is (the wgmma kernel's warpgroup 1 runs tile 1
// alone). `red` holds the results rounded to BF16 (DESIGN.md §4: a = BF16(W x)).
template <int BM, int kTiles, bool kExtended>
__device__ __forceinline__ void TaskEpilogues(const LayerParams& p, const TaskDesc& d,
                                              const uint16_t* red, int pitch,
                                              int tile_offset = 0) {
  constexpr int64_t kActBytes = 2;  // h_q, hs_q: BF16
  const int I = p.dims.intermediate;
  const int Is = p.dims.shared_intermediate;
  const int64_t first = static_cast<int64_t>(d.block) * BM;
#pragma unroll
  for (int s = 0; s < kTiles; ++s) {
    const uint16_t* red_tile = red + s * kTileRows * pitch;
    auto red_at = [red_tile, pitch](int r, int n) {
      return Bf16ToFloat(red_tile[RedRowStart(r, pitch, 2) + n]);
    };
    const int tile = d.tile + tile_offset + s;
    switch (d.kind) {
      case kSharedW1:
        SwigluEpilogue<4, kExtended>(p, red_at, d.rows, tile, Is, nullptr,
                                     p.hs_q + first * Is * kActBytes);
        break;
      case kRoutedW1:
        SwigluEpilogue<4, kExtended>(p, red_at, d.rows, tile, I, p.meta + first,
                                     p.h_q + first * I * kActBytes);
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
// the block size (the wgmma kernel's merged blocks) completes its tail block's too.
// The warpgroup's barrier orders its threads' stores before the leader's release, which is
// cumulative: one fence.acq_rel and relaxed adds, rather than a fence.sc per add (measurably
// slower: docs/DESIGN-NOTES.md).
__device__ __forceinline__ void FinishTask(const LayerParams& p, const TaskDesc& d, int tiles,
                                           uint64_t start_ns, int leader = 0) {
  if (static_cast<int>(threadIdx.x) != leader) return;
  if (p.task_trace != nullptr && d.task < p.task_trace_cap) {
    p.task_trace[d.task].start_ns = start_ns;
    p.task_trace[d.task].done_ns = GlobalTimerNs();
  }
  if (d.kind == kRoutedW1) {
    FenceAcqRelGpu();  // one fence for the two or four adds
    RedAddRelaxedGpu(&p.w1_done[d.block], tiles);
    RedAddRelaxedGpu(&p.ring_empty[d.block % p.ring_blocks], tiles);
    if (d.rows > p.bm) {
      RedAddRelaxedGpu(&p.w1_done[d.block + 1], tiles);
      RedAddRelaxedGpu(&p.ring_empty[(d.block + 1) % p.ring_blocks], tiles);
    }
  } else if (d.kind == kSharedW1) {
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

template <int BM, bool kExtended>
__device__ void Consumers(const LayerParams& p, uint8_t* stage_base, int stages, int stage_bytes,
                          uint8_t* red_buffer, Barriers& bars) {
  constexpr int kTiles = Role2TilesPerTask(BM);
  constexpr int kAcc = kTiles * BM / 2;  // per tile s: acc[s * BM / 2 ..]
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int Is = p.dims.shared_intermediate;
  const int a_region = kTiles * ARegionBytes(Is > 0);  // B follows the task's tiles
  const bool red_in_stage = RedInStage(BM, Is > 0);
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
      RunMainloop<BM, true>(d, stage_base, stages, stage_bytes, a_region, bars, mbar_timeout, env,
                            acc, ring, red_in_stage);
    } else {
      RunMainloop<BM, false>(d, stage_base, stages, stage_bytes, a_region, bars, mbar_timeout, env,
                             acc, ring, red_in_stage);
    }
    // RedInStage: the results go over the task's last stage, once every consumer is done with it.
    const int held = ring.stage == 0 ? stages - 1 : ring.stage - 1;
    uint16_t* red = reinterpret_cast<uint16_t*>(
        red_in_stage ? stage_base + static_cast<int64_t>(held) * stage_bytes : red_buffer);
    if (red_in_stage) NamedBarrier(kConsumerBarrierId, kConsumerThreads);
    if (d.scale_shift != 0) {
      const float undo = FloatFromBits(static_cast<uint32_t>(127 + d.scale_shift) << 23);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] *= undo;  // exact: a power of two
    }
    if constexpr (kExtended) {
      if (const float* bias = TileBias(p, d.kind, d.block, d.tile); bias != nullptr) {
        const RowMeta* meta = p.meta + static_cast<int64_t>(d.block) * BM;
#pragma unroll
        for (int s = 0; s < kTiles; ++s) {
          float* tile_acc = &acc[s * BM / 2];
          const float* tile_bias = bias + s * kTileRows;
          if (d.kind == kRoutedW2) {
            AddTileBias<BM, true>(tile_acc, tile_bias, warp * 16 + g, meta, d.rows);
          } else {
            AddTileBias<BM, false>(tile_acc, tile_bias, warp * 16 + g, meta, d.rows);
          }
        }
      }
    }

    // The tiles' results to shared memory: red[tile s row 0..63 at 64 s + row][token].
#pragma unroll
    for (int s = 0; s < kTiles; ++s) {
      const int row = s * kTileRows + warp * 16 + g;
#pragma unroll
      for (int j = 0; j < BM / 8; ++j) {
        const int col = 8 * j + 2 * t;
        const float* a = &acc[s * BM / 2 + 4 * j];
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // both tokens in one store (RedRowStart)
          uint16_t* at = red + RedRowStart(row + 8 * h, RedPitch(BM), 2) + col;
          *reinterpret_cast<uint32_t*>(at) = Bf16Bits(a[2 * h]) | Bf16Bits(a[2 * h + 1]) << 16;
        }
      }
    }
    NamedBarrier(kConsumerBarrierId, kConsumerThreads);  // red complete
    TaskEpilogues<BM, kTiles, kExtended>(p, d, red, RedPitch(BM));
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

// ---- the wgmma kernel (BM 64: bf16_wgmma_sm90.cuh) --------------------------------------------

// Warpgroup `group` (threads 128 group ..) of the consumers: tile `group` of every task.
template <bool kShared, bool kMerge, bool kExtended>
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
            ? RunWideTask<true, kMerge, kExtended>(p, d, stage_base, stages, stage_bytes,
                                                   a_tile_region, bars, mbar_timeout, env, ring,
                                                   group, token_half_bytes)
            : RunWideTask<false, kMerge, false>(p, d, stage_base, stages, stage_bytes,
                                                a_tile_region, bars, mbar_timeout, env, ring,
                                                group, token_half_bytes);
    const int held = ring.stage == 0 ? stages - 1 : ring.stage - 1;  // the stage red is over
    NamedBarrier(barrier, kConsumerThreads);                         // red complete
    TaskEpilogues<kWideBm, 1, kExtended>(p, d, red_tile, kWideRedPitch, group);
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
// path's registers cost the other loops 0.5-2.7 %. Each also with the extended epilogue
// (kExtended, gemm_epilogue_sm90.cuh): its bias code cost the default instances' K loops spills.
template <bool kShared, bool kMerge, bool kExtended>
__global__ void __launch_bounds__(kWideThreads, kWideMaxCtasPerSm)
    GroupedGemmWgmmaBf16Kernel(const __grid_constant__ LayerParams p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // The swizzled layout needs 1024-aligned atoms (WideSmemBytes reserves the slack).
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  const int stages = p.r2_stages;
  constexpr int stage_bytes = WideStageBytes(kShared);
  Barriers& bars = *reinterpret_cast<Barriers*>(smem + static_cast<size_t>(stages) * stage_bytes);
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
    Producer<kWideBm, true, kShared, kMerge>(p, smem, stages, stage_bytes, bars);
  } else {
    WideConsumers<kShared, kMerge, kExtended>(p, smem, stages, stage_bytes, bars);
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");  // as GroupedGemmStreamKernel
}

// Register cap: each of an SM's 4 schedulers owns a quarter of the register file and a CTA's
// 5 warps spread over them, so TargetCtasPerSm CTAs fit only at <= 96 (4 CTAs), 128 (3) or
// 168 (2) registers. Given as __maxnreg__: the launch-bounds form derives the same caps but
// its code for BM 8 ran slower.
__host__ __device__ constexpr int MaxRegisters(int bm) {
  return 65536 / 4 / ((TargetCtasPerSm(bm) * (kStreamThreads / 32) + 3) / 4) / 32 / 8 * 8;
}
template <int BM, bool kExtended>
__global__ void __launch_bounds__(kStreamThreads) __maxnreg__(MaxRegisters(BM))
    GroupedGemmStreamKernel(const __grid_constant__ LayerParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int stages = p.r2_stages;
  const bool has_shared = p.dims.shared_intermediate > 0;
  const int stage_bytes = StageBytes(BM, has_shared);
  // The results buffer after the stages, unless the results go over a stage (RedInStage).
  uint8_t* red = smem + static_cast<size_t>(stages) * stage_bytes;
  Barriers& bars = *reinterpret_cast<Barriers*>(
      red + (RedInStage(BM, has_shared) ? 0 : RedBytes(BM)));
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
    Producer<BM>(p, smem, stages, stage_bytes, bars);
  } else {
    Consumers<BM, kExtended>(p, smem, stages, stage_bytes, red, bars);
  }
  // Launched early behind role1 (LaunchGroupedGemmRole2's `early`), this grid must not end
  // before role1 has: role3, next in the stream, resets what role1 may still be using. A no-op
  // otherwise.
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

using GemmKernelFn = void (*)(LayerParams);

// has_shared: the layer has the shared expert (the wgmma kernel has an instance for each);
// merge_tails: the wgmma kernel's instance that runs merged tails (without the shared expert).
template <bool kExtended>
GemmKernelFn KernelFor(int bm, bool has_shared, bool merge_tails) {
  switch (bm) {
    case 8:
      return GroupedGemmStreamKernel<8, kExtended>;
    case 16:
      return GroupedGemmStreamKernel<16, kExtended>;
    case 32:
      return GroupedGemmStreamKernel<32, kExtended>;
    case kWideBm:
      if (has_shared) return GroupedGemmWgmmaBf16Kernel<true, false, kExtended>;
      return merge_tails ? GroupedGemmWgmmaBf16Kernel<false, true, kExtended>
                         : GroupedGemmWgmmaBf16Kernel<false, false, kExtended>;
    default:
      return nullptr;
  }
}
// extended: the instances with the extended epilogue (ExtendedEpilogue).
GemmKernelFn KernelFor(int bm, bool has_shared, bool merge_tails, bool extended) {
  return extended ? KernelFor<true>(bm, has_shared, merge_tails)
                  : KernelFor<false>(bm, has_shared, merge_tails);
}

}  // namespace

cudaError_t LoadGroupedGemmKernels() {
  for (int bm : kBlockSizes) {
    for (int variant = 0; variant < 8; ++variant) {
      const GemmKernelFn kernel = KernelFor(bm, variant & 1, variant & 2, variant & 4);
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
  return cudaSuccess;
}

cudaError_t Role2ShapeFor(const LayerDims& dims, int bm, Role2Shape* shape) {
  const bool has_shared = dims.shared_intermediate > 0;
  const GemmKernelFn kernel = KernelFor(bm, has_shared, true, ExtendedEpilogue(dims));
  if (kernel == nullptr) return cudaErrorInvalidValue;
  const bool wide = bm == kWideBm;
  // As many stages as fit the shared memory of TargetCtasPerSm resident CTAs (the wgmma kernel:
  // of WideCtasPerSm).
  int stages = wide ? WideStages(has_shared)
                    : StagesFitting(bm, has_shared, RedInStage(bm, has_shared));
  const int min_stages = wide ? kWideMinStages : kMinStages;
  stages = stages < min_stages ? min_stages : (stages > kMaxStages ? kMaxStages : stages);
  shape->threads = wide ? kWideThreads : kStreamThreads;
  shape->stages = stages;
  shape->smem_bytes =
      wide ? WideSmemBytes(has_shared, stages) : StreamSmemBytes(bm, has_shared, stages);
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&shape->blocks_per_sm, kernel,
                                                       shape->threads, shape->smem_bytes);
}

cudaError_t LaunchGroupedGemmRole2(const LayerParams& params, const Role2Shape& shape, int grid,
                                   cudaStream_t stream, bool early, bool merge_tails) {
  const GemmKernelFn kernel = KernelFor(params.bm, params.dims.shared_intermediate > 0,
                                        merge_tails, ExtendedEpilogue(params.dims));
  if (kernel == nullptr || params.r2_stages != shape.stages) return cudaErrorInvalidValue;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(static_cast<unsigned>(shape.threads));
  config.dynamicSmemBytes = shape.smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute;
  AllowProgrammaticLaunch(early, &config, &attribute);
  return cudaLaunchKernelEx(&config, kernel, params);
}

}  // namespace gcmoe::kernels
