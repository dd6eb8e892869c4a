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
cudaError_t LoadGroupedGemmKernels();  // the mma.sync stepping stone
cudaError_t LoadStreamGemmKernels();   // the warp-specialized kernels
cudaError_t LoadFinalizeRole3Kernel();
cudaError_t LoadAllToAllKernels();

// Which role2 kernel a layer graph runs.
enum class GemmKernel : int {
  kMmaSync = 0,  // stepping stone: 8 warps, per-warp cp.async rings, mma.sync
  // Warp-specialized bulk-copy pipeline (`stream`): E4M3 mma.sync consumers for W1; for W2 at
  // BM <= 32 the register-A FP8 wgmma below, whose reduced-precision K32 sums only reach the
  // BF16 output (no requantization follows W2): 1.05-1.07x, calc_diff 2e-7 against the CPU.
  kStreamMma = 1,
  // The same pipeline with register-A wgmma m64nNk32 E4M3: faster, but the FP8 tensor core
  // sums each K32 block's products at reduced precision, and after the E4M3 requantization of
  // h two GPU tests exceed calc_diff 1e-4 (docs/PERFORMANCE.md); opt-in until that is fixed.
  kStreamWgmma = 2,
  // The same pipeline with exact BF16 operands (`bf16`; the default below BM 64). Weights decoded
  // to BF16 times their block scale in registers, activations read as BF16 rows written once per
  // block (role1's pull, the W1 epilogue: LayerParams::act_bf16), mma.sync m16n8k16 BF16 summing
  // the whole K in FP32: no E4M3 operand conversions (sm_90 emulates E4M3 mma.sync on the FP16
  // tensor cores) and no per-K32 scale folding. 1.12-1.33x faster than `stream` and as accurate
  // (docs/PERFORMANCE.md). Needs its own lane-word placement (TileFormat::kE2M1Bf16); block
  // scales above its multipliers' range load shifted (StepHeader::scale_shift).
  kStreamBf16 = 3,
  // The default (`bf16-wgmma`): kStreamBf16, except that BM 64 runs the register-A wgmma kernel
  // (bf16_wgmma_sm90.cuh): the same decoded weights as the A registers of wgmma m64nNk16, two
  // consumer warpgroups (one per tile of the task), three CTAs per SM, and the block's tokens read
  // by the tensor core from shared memory, so one warpgroup's MMAs overlap the others' decode. Same
  // operands and numerics; its graph writes the BF16 rows in the wgmma order (Bf16ActOrder).
  // Against kStreamBf16's BM 32 (GLM-5.2, docs/PERFORMANCE.md, session 12): 1.33x faster at 64
  // rows per expert, 0.99x at 16, 0.80x at 2. The block-size rule picks 64 from a mean of 22.6
  // (set in session 11, when BM 64 was 1.1-1.26x slower at 8-16 rows).
  kWgmmaBf16 = 4,
};
// Kernels reading exact BF16 operands: the kE2M1Bf16 weight tiles and BF16 activation rows
// (LayerParams::act_bf16).
GCMOE_HOST_DEVICE constexpr bool UsesBf16Operands(GemmKernel kernel) {
  return kernel == GemmKernel::kStreamBf16 || kernel == GemmKernel::kWgmmaBf16;
}
// The block size at which kWgmmaBf16 runs its own kernel (bf16_wgmma_sm90.cuh, kWideBm), and
// the rows of an expert's last block that kernel computes with the full block before it, at an
// MMA width of up to kWgmmaBf16Bm + kWgmmaBf16MaxTailRows (RingBlock::tail_rows).
inline constexpr int kWgmmaBf16Bm = 64;
inline constexpr int kWgmmaBf16MaxTailRows = 16;
// LayerParams::act_bf16 of a graph: 0 (E4M3 rows), or the K order of its BF16 rows
// (bf16_operands.h): kBf16WgmmaOrder where the bf16-wgmma kernel runs (BM 64), else
// kBf16MmaOrder.
GCMOE_HOST_DEVICE constexpr int Bf16ActOrder(GemmKernel kernel, int bm) {
  return !UsesBf16Operands(kernel)                                ? 0
         : kernel == GemmKernel::kWgmmaBf16 && bm == kWgmmaBf16Bm ? kBf16WgmmaOrder
                                                                  : kBf16MmaOrder;
}
const char* GemmKernelName(GemmKernel kernel);

// Weight tiles one role2 task covers: two adjacent tiles for the bf16 kernel at BM >= 16, where
// each consumer warp's two 16-row stripes share every activation load and a stage's activations
// feed 128 weight rows (at 32 and 64 tokens per block a 64-row tile's activations are 2-4x its
// weight bytes); one otherwise (fewer, longer tasks would idle CTAs at small T). At BM 16 the
// second tile costs a CTA per SM (stream_pipeline_sm90.cuh, TargetCtasPerSm) and still gains
// 1.04-1.09x at GLM-5.2 T = 16..64 and 1.03-1.07x at DeepSeek-V4.1-Flash T = 4..64, against
// 0.96x at GLM-5.2 T = 8 (measured with BM 16 pinned, H200, 2026-12-01).
GCMOE_HOST_DEVICE constexpr int Role2TilesPerTask(GemmKernel kernel, int bm) {
  return UsesBf16Operands(kernel) && bm >= 16 ? 2 : 1;
}

// Launch shape of role2 for one block size.
struct Role2Shape {
  int threads = 0;
  int stages = 0;  // streaming kernels: shared-memory stages (LayerParams::r2_stages)
  size_t smem_bytes = 0;
  int blocks_per_sm = 0;  // resident CTAs per SM (occupancy calculator)
};
cudaError_t Role2ShapeFor(GemmKernel kernel, const LayerDims& dims, int block_rows,
                          Role2Shape* shape);

// The per-kernel parts of Role2ShapeFor and LaunchGroupedGemmRole2.
size_t Role2SmemBytes(int block_rows);
cudaError_t Role2BlocksPerSm(int block_rows, int* blocks_per_sm);
cudaError_t LaunchMmaSyncGemmRole2(const LayerParams& params, int grid, cudaStream_t stream);
cudaError_t StreamGemmShape(const LayerDims& dims, GemmKernel kernel, int block_rows,
                            Role2Shape* shape);
// early: programmatic dependent launch behind the kernel before it in `stream` (role1): the
// grid may start once role1 triggers it, and ends only after role1 has. merge_tails: the
// bf16-wgmma kernel's instance that runs merged tails (RingBlock::tail_rows); the other ignores
// the marking, so it serves steps without tails, faster (LayerGraph::Replay).
cudaError_t LaunchStreamGemmRole2(const LayerParams& params, GemmKernel kernel,
                                  const Role2Shape& shape, int grid, cudaStream_t stream,
                                  bool early = false, bool merge_tails = true);

// role1: quantize this rank's tokens, route every assignment into its computing rank's receive
// index, barrier (grid, then cross-rank tag 1), pull ring blocks and release their full counters.
cudaError_t LaunchDispatchRole1(const LayerParams& params, int grid, cudaStream_t stream);
// role2: the grouped GEMM task stream (shared W1, routed W1, shared W2, routed W2). early: the
// streaming kernels launch behind role1 programmatically (LaunchStreamGemmRole2).
cudaError_t LaunchGroupedGemmRole2(GemmKernel kernel, const LayerParams& params,
                                   const Role2Shape& shape, int grid, cudaStream_t stream,
                                   bool early = false, bool merge_tails = true);
// role3: combine readiness, slot-order reduction into the output, signal reset, parity flip.
// early: programmatic dependent launch behind role2 (LaunchStreamGemmRole2's `early` for role1
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
