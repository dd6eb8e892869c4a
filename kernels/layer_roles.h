// Launchers of the three role kernels of a GC-MoE layer replay (DESIGN.md §6). Raw parameters
// and a stream in, cudaError_t out; layer_graph.cu captures them into one graph.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "kernels/bf16_operands.h"
#include "kernels/host_device.h"
#include "kernels/layer_types.h"

namespace gcmoe::kernels {

// Loads every role kernel (each grouped-GEMM instantiation included) and sets its shared-memory
// limit. A kernel that spins on another kernel deadlocks if that kernel's module is still to be
// loaded lazily, so this runs before the first capture or launch.
cudaError_t LoadLayerKernels();
// The per-file parts of LoadLayerKernels.
cudaError_t LoadDispatchRole1Kernel();
cudaError_t LoadGroupedGemmKernels();
cudaError_t LoadFinalizeRole3Kernel();
cudaError_t LoadAllToAllKernels();

// role2 computes with exact BF16 operands at every block size: the weights decoded from E2M1 (or
// the shared expert's E4M3) to BF16 times their block scale in registers, the activations as BF16
// rows written once per block (role1, the W1 epilogue: LayerParams::act_bf16), and BF16 MMAs that
// sum the whole K in FP32. That is the numerics spec's dot product with no reduced-precision
// tensor-core sums (FP8 wgmma sums a K32 block at reduced precision, and the E4M3 requantization
// of h turns that into flipped codes: docs/DESIGN-NOTES.md). Block sizes 8, 16 and 32 run the
// mma.sync m16n8k16 kernel; BM 64 runs the register-A wgmma kernel (bf16_wgmma_sm90.cuh): two
// consumer warpgroups, one per tile of a task, three CTAs per SM, the block's tokens read by the
// tensor core from shared memory, so one warpgroup's MMAs overlap the other's decode.
//
// The block size at which role2 runs the wgmma kernel, and the rows of an expert's last block
// that kernel computes with the full block before it, at an MMA width of up to
// kWgmmaBm + kWgmmaMaxTailRows (RingBlock::tail_rows).
inline constexpr int kWgmmaBm = 64;
inline constexpr int kWgmmaMaxTailRows = 16;
// LayerParams::act_bf16 of a graph: the K order of its BF16 rows (bf16_operands.h):
// kBf16WgmmaOrder where the wgmma kernel runs (BM 64), else kBf16MmaOrder.
GCMOE_HOST_DEVICE constexpr int Bf16ActOrder(int bm) {
  return bm == kWgmmaBm ? kBf16WgmmaOrder : kBf16MmaOrder;
}

// Weight tiles one role2 task covers: two adjacent tiles at BM >= 16, where each consumer warp's
// two 16-row stripes share every activation load and a stage's activations feed 128 weight rows
// (at 32 and 64 tokens per block a 64-row tile's activations are 2-4x its weight bytes); one at
// BM 8 (fewer, longer tasks would idle CTAs at small T). At BM 16 the second tile costs a CTA per
// SM (stream_pipeline_sm90.cuh, TargetCtasPerSm) and is still faster at most token counts on both
// model slices (docs/DESIGN-NOTES.md).
GCMOE_HOST_DEVICE constexpr int Role2TilesPerTask(int bm) { return bm >= 16 ? 2 : 1; }

// Launch shape of role2 for one block size.
struct Role2Shape {
  int threads = 0;
  int stages = 0;  // shared-memory stages of its pipeline (LayerParams::r2_stages)
  size_t smem_bytes = 0;
  int blocks_per_sm = 0;  // resident CTAs per SM (occupancy calculator)
};
cudaError_t Role2ShapeFor(const LayerDims& dims, int block_rows, Role2Shape* shape);
// early: programmatic dependent launch behind the kernel before it in `stream` (role1): the
// grid may start once role1 triggers it, and ends only after role1 has. merge_tails: the wgmma
// kernel's instance that runs merged tails (RingBlock::tail_rows); the other ignores the
// marking, so it serves steps without tails, faster (LayerGraph::Replay).
cudaError_t LaunchGroupedGemmRole2(const LayerParams& params, const Role2Shape& shape, int grid,
                                   cudaStream_t stream, bool early = false,
                                   bool merge_tails = true);

// role1: quantize this rank's tokens, route every assignment into its computing rank's receive
// index, barrier (grid, then cross-rank tag 1), pull ring blocks and release their full counters.
cudaError_t LaunchDispatchRole1(const LayerParams& params, int grid, cudaStream_t stream);
// role2: the grouped GEMM task stream (shared W1, routed W1, shared W2, routed W2):
// LaunchGroupedGemmRole2 above.
// role3: combine readiness, slot-order reduction into the output, signal reset, parity flip.
// early: programmatic dependent launch behind role2 (LaunchGroupedGemmRole2's `early` for role1
// and role2): its CTAs may start as role2's leave, once every role2 CTA is out of tasks.
cudaError_t LaunchFinalizeRole3(const LayerParams& params, int grid, cudaStream_t stream,
                                bool early = false);
// role3's CTAs per SM: up to kRole3CtasPerSm, as many as are resident at once (every CTA spins
// on the combine counter that CTA 0 raises, so the whole grid must be resident).
inline constexpr int kRole3CtasPerSm = 3;
cudaError_t Role3CtasPerSm(int* ctas);

// The NCCL all-to-all baseline's own kernels (alltoall_exchange.cu), launched eagerly in this
// order around the engine's NCCL rounds, with role2 and role3 between them.
enum class AllToAllStage : int {
  kQuantize,      // this rank's tokens to E4M3 (x_q, x_s)
  kPack,          // one record per local assignment, grouped by computing rank
  kUnpack,        // received records into ring blocks; opens every block and the shared expert
  kPackReturn,    // partials of records from other ranks, in receive order
  kUnpackReturn,  // returned partials into the combine buffer
};
cudaError_t LaunchAllToAllStage(AllToAllStage stage, const LayerParams& params, int grid,
                                cudaStream_t stream);

}  // namespace gcmoe::kernels
