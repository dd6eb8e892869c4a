// The warp-specialized role2's shared-memory pipeline (grouped_gemm_wgmma_fp8_fp4_sm90.cu):
// the CTA's shape, the stage layout, the barriers and task descriptor its producer warp and
// consumer warpgroup share, and the ring cursor both advance.
//
// Pipeline invariants (stage s, its use u counted by a RingCursor, parity u & 1):
//   full[s]  count 33: the producer lane 0's arrive.expect_tx (A bytes) + one arrival per
//            producer lane once its cp.async of the stage landed and it executed
//            fence.proxy.async (B is written through the generic proxy, read by wgmma through
//            the async proxy). At most kLagStages stages wait for that release, and
//            kLagStages < stages, so the producer's empty wait never waits on itself; before
//            any other blocking wait it releases everything. The bf16 kernel has no lag: from
//            BM 16 on its B comes by TMA boxes (tma_map.h: lanes 0..3, one box per K32 block)
//            counted in the expect_tx, and each lane arrives once its box, if any, is issued; at
//            BM 8 each lane's arrival is a cp.async.mbarrier.arrive behind its copies (mma.sync
//            reads B with generic loads, so no proxy fence is due). The bf16-wgmma kernel's full
//            barrier counts only the expect_tx arrival (bf16_wgmma_sm90.cuh).
//   empty[s] count 128: every consumer thread, after the MMAs reading the stage completed
//            (wgmma: wait_group 0) and a proxy fence behind its own shared loads (the refill's bulk
//            copy writes through the async proxy); the producer waits on it before refilling.
//            With RedInStage, the stage of a task's last chunk is released only after the task's
//            epilogue has read the results written over it.
//   desc_full/desc_empty (2 slots): the task descriptor, published before its stages.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/layer_roles.h"
#include "kernels/layer_types.h"
#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::kernels::stream_role2 {

inline constexpr int kConsumerThreads = 128;
inline constexpr int kStreamThreads = kConsumerThreads + 32;
inline constexpr int kMaxStages = 16;
inline constexpr int kDescSlots = 2;
inline constexpr uint32_t kConsumerBarrierId = 1;
inline constexpr uint32_t kFullArrivals = 33;
// Stages whose activation cp.async may still be in flight before the producer releases them
// (each release waits for its own cp.async, fences, then arrives): keeps B loads pipelined.
inline constexpr int kLagStages = 2;

// Resident CTAs per SM each kernel and block size is built for (registers and shared memory
// follow). The bf16 kernel's two tiles per task at BM 16 need 3: at 4 (96 registers) they spill.
__host__ __device__ constexpr int TargetCtasPerSm(GemmKernel kernel, int bm) {
  return bm <= 8 ? 4 : bm == 16 ? (Role2TilesPerTask(kernel, bm) == 2 ? 3 : 4) : bm == 32 ? 3 : 2;
}
// A stage: per weight tile of the task (Role2TilesPerTask) its four stripe chunks (room for E4M3
// when the layer has a shared expert), then B [8 K16 units][bm rows][16 bytes], then the scale
// windows [bm rows][16 bytes]. The bf16 kernel's B is BF16 and needs no scales: [4 K32 blocks][bm
// rows][4 lane units][16 bytes] (bf16_operands.h, block column order).
__host__ __device__ constexpr int ARegionBytes(bool has_shared) {
  return 4 * ChunkBytes(has_shared ? TileFormat::kE4M3 : TileFormat::kE2M1);
}
__host__ __device__ constexpr int StageBytes(GemmKernel kernel, int bm, bool has_shared) {
  return Role2TilesPerTask(kernel, bm) * ARegionBytes(has_shared) +
         (kernel == GemmKernel::kStreamBf16 ? bm * 2 * kChunkK : bm * kChunkK + bm * 16);
}
// The bf16 kernel's B boxes come by TMA, whose shared-memory destinations are 128-aligned.
static_assert(ARegionBytes(false) % 128 == 0 && ARegionBytes(true) % 128 == 0);
// The task's results, red[tile row 0 .. 64 x tiles - 1][token], padded against conflicts: FP32,
// or BF16 for the bf16 kernel, whose epilogues round every result to BF16 first, so that storing
// them rounded is exact (and leaves BM 32 a fourth stage at three CTAs per SM).
__host__ __device__ constexpr int RedPitch(int bm) { return bm + 1; }
__host__ __device__ constexpr int RedValueBytes(GemmKernel kernel) {
  return kernel == GemmKernel::kStreamBf16 ? 2 : 4;
}
// Where row r of a results tile starts (values, from the tile's start; tiles hold an even number
// of rows). BF16 rows at an odd pitch start one value later on odd rows, so that every row is
// 4-byte aligned and a lane's two adjacent tokens are one 32-bit store; the rows still fit in
// rows x pitch values.
__host__ __device__ constexpr int RedRowStart(int r, int pitch, int value_bytes) {
  return r * pitch + (value_bytes == 2 && pitch % 2 == 1 ? r % 2 : 0);
}
__host__ __device__ constexpr int RedBytes(GemmKernel kernel, int bm) {
  return Role2TilesPerTask(kernel, bm) * kTileRows * RedPitch(bm) * RedValueBytes(kernel);
}

struct TaskDesc {
  int32_t kind;  // TaskKind, or -1: no further task
  int32_t block;
  int32_t tile;
  int32_t rows;         // valid tokens, 1..BM
  int32_t n;            // MMA width (valid-M sizing)
  int32_t k;            // contraction
  int32_t scale_mod;    // the activation scales' address mod 16 (the windows are 16-aligned)
  int32_t task;         // index in the task space (the trace's slot)
  int32_t scale_shift;  // the bf16 kernel: results times 2^scale_shift (StepHeader::scale_shift)
};

struct Barriers {
  uint64_t full[kMaxStages];
  uint64_t empty[kMaxStages];
  uint64_t desc_full[kDescSlots];
  uint64_t desc_empty[kDescSlots];
  TaskDesc desc[kDescSlots];
};

// A position in the stage ring: the stage and the parity of its use. Advanced by compare and
// flip, not `iteration % stages` (a runtime division: ~15 instructions per K128 step in SASS).
struct RingCursor {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void Advance(int stages) {
    if (++stage == stages) stage = 0, phase ^= 1;
  }
};

// Per-SM shared memory of sm_90 and what the runtime reserves per resident CTA.
inline constexpr int kSmemPerSm = 232448;
inline constexpr int kSmemReservedPerCta = 1024;
// The fewest stages a ring runs with: the wgmma kernels' release lag needs kLagStages + 1. The
// bf16 kernel has no lag and is held to the same floor, which also marks where its occupancy
// would drop (RedInStage).
inline constexpr int kMinStages = kLagStages + 1;

// Stages that fit TargetCtasPerSm resident CTAs, with the results buffer after them or
// (red_in_stage) over the stage of the task's last chunk.
__host__ __device__ constexpr int StagesFitting(GemmKernel kernel, int bm, bool has_shared,
                                                bool red_in_stage) {
  return (kSmemPerSm / TargetCtasPerSm(kernel, bm) - kSmemReservedPerCta -
          (red_in_stage ? 0 : RedBytes(kernel, bm)) - static_cast<int>(sizeof(Barriers))) /
         StageBytes(kernel, bm, has_shared);
}
// The bf16 kernel writes a task's results over the stage of its last chunk (its consumers then
// release that stage after the epilogue, not after the MMAs) where a separate buffer would leave
// fewer than kMinStages at the target occupancy: with the shared expert at BM 32 and 64, which
// then keep 3 and 2 CTAs per SM instead of 2 and 1. Elsewhere holding the stage through the
// epilogue cost 1-4 % (measured, H200, 2026-12-01), even where it gained a stage.
__host__ __device__ constexpr bool RedInStage(GemmKernel kernel, int bm, bool has_shared) {
  return kernel == GemmKernel::kStreamBf16 &&
         RedBytes(kernel, bm) <= StageBytes(kernel, bm, has_shared) &&
         StagesFitting(kernel, bm, has_shared, false) < kMinStages;
}
__host__ __device__ constexpr size_t StreamSmemBytes(GemmKernel kernel, int bm, bool has_shared,
                                                     int stages) {
  return static_cast<size_t>(stages) * StageBytes(kernel, bm, has_shared) +
         (RedInStage(kernel, bm, has_shared) ? 0 : RedBytes(kernel, bm)) + sizeof(Barriers);
}

// The bf16 kernel's BF16 results leave routed-only BM 32 four stages (FP32 ones: three).
static_assert(StagesFitting(GemmKernel::kStreamBf16, 32, false, false) == 4);
// Both cases the rule is for, and one it leaves alone (routed-only BM 32 fits 4 stages).
static_assert(RedInStage(GemmKernel::kStreamBf16, 32, true));
static_assert(RedInStage(GemmKernel::kStreamBf16, 64, true));
static_assert(!RedInStage(GemmKernel::kStreamBf16, 32, false));

// The smallest MMA width covering `rows` tokens, at most BM.
__device__ __forceinline__ int MmaWidth(int rows, int bm) {
  const int n = rows <= 8 ? 8 : rows <= 16 ? 16 : rows <= 32 ? 32 : 64;
  return n < bm ? n : bm;
}

}  // namespace gcmoe::kernels::stream_role2
