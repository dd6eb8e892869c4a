// role2's shared-memory pipeline (grouped_gemm_sm90.cu): the CTA's shape, the stage layout, the
// barriers and task descriptor its producer warp and consumer warpgroup(s) share, and the ring
// cursor both advance.
//
// Pipeline invariants (stage s, its use u counted by a RingCursor, parity u & 1):
//   full[s]  count 33: the producer lane 0's arrive.expect_tx (the weights' bytes, plus B's from
//            BM 16 on, where B comes by TMA boxes: tma_map.h, lanes 0..3, one box per K32 block)
//            + one arrival per producer lane once its box, if any, is issued; at BM 8 each
//            lane's arrival is a cp.async.mbarrier.arrive behind its copies (mma.sync reads B
//            with generic loads, so no proxy fence is due). The wgmma kernel's full barrier
//            counts only the expect_tx arrival (bf16_wgmma_sm90.cuh).
//   empty[s] count 128: every consumer thread, after the MMAs reading the stage completed and a
//            proxy fence behind its own shared loads (the refill's bulk copy writes through the
//            async proxy); the producer waits on it before refilling.
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

// Resident CTAs per SM each block size is built for (registers and shared memory follow). The
// two tiles per task at BM 16 need 3: at 4 (96 registers) they spill.
__host__ __device__ constexpr int TargetCtasPerSm(int bm) {
  return bm <= 8 ? 4 : bm == 16 ? (Role2TilesPerTask(bm) == 2 ? 3 : 4) : bm == 32 ? 3 : 2;
}
// A stage: per weight tile of the task (Role2TilesPerTask) its four stripe chunks (room for E4M3
// when the layer has a shared expert), then B, the BF16 token rows: [4 K32 blocks][bm rows][4 lane
// units][16 bytes] (bf16_operands.h, block column order).
__host__ __device__ constexpr int ARegionBytes(bool has_shared) {
  return 4 * ChunkBytes(has_shared ? TileFormat::kE4M3 : TileFormat::kE2M1);
}
__host__ __device__ constexpr int StageBytes(int bm, bool has_shared) {
  return Role2TilesPerTask(bm) * ARegionBytes(has_shared) + bm * 2 * kChunkK;
}
// B's boxes come by TMA, whose shared-memory destinations are 128-aligned.
static_assert(ARegionBytes(false) % 128 == 0 && ARegionBytes(true) % 128 == 0);
// The task's results, red[tile row 0 .. 64 x tiles - 1][token], padded against conflicts, as
// BF16: the epilogues round every result to BF16 first, so storing them rounded is exact (and
// leaves BM 32 a fourth stage at three CTAs per SM).
__host__ __device__ constexpr int RedPitch(int bm) { return bm + 1; }
// Where row r of a results tile starts (values, from the tile's start; tiles hold an even number
// of rows). BF16 rows at an odd pitch start one value later on odd rows, so that every row is
// 4-byte aligned and a lane's two adjacent tokens are one 32-bit store; the rows still fit in
// rows x pitch values.
__host__ __device__ constexpr int RedRowStart(int r, int pitch, int value_bytes) {
  return r * pitch + (value_bytes == 2 && pitch % 2 == 1 ? r % 2 : 0);
}
__host__ __device__ constexpr int RedBytes(int bm) {
  return Role2TilesPerTask(bm) * kTileRows * RedPitch(bm) * 2;
}

struct TaskDesc {
  int32_t kind;  // TaskKind, or -1: no further task
  int32_t block;
  int32_t tile;
  int32_t rows;         // valid tokens, 1..BM
  int32_t n;            // MMA width (valid-M sizing)
  int32_t k;            // contraction
  int32_t task;         // index in the task space (the trace's slot)
  int32_t scale_shift;  // results times 2^scale_shift (StepHeader::scale_shift)
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
// The fewest stages a ring runs with; below it occupancy drops instead (RedInStage).
inline constexpr int kMinStages = 3;

// Stages that fit TargetCtasPerSm resident CTAs, with the results buffer after them or
// (red_in_stage) over the stage of the task's last chunk.
__host__ __device__ constexpr int StagesFitting(int bm, bool has_shared, bool red_in_stage) {
  return (kSmemPerSm / TargetCtasPerSm(bm) - kSmemReservedPerCta -
          (red_in_stage ? 0 : RedBytes(bm)) - static_cast<int>(sizeof(Barriers))) /
         StageBytes(bm, has_shared);
}
// A task's results go over the stage of its last chunk (its consumers then release that stage
// after the epilogue, not after the MMAs) where a separate buffer would leave fewer than
// kMinStages at the target occupancy: with the shared expert at BM 32, which then keeps 3 CTAs
// per SM instead of 2. Elsewhere holding the stage through the epilogue measured 1-4 % slower,
// even where it gained a stage.
__host__ __device__ constexpr bool RedInStage(int bm, bool has_shared) {
  return RedBytes(bm) <= StageBytes(bm, has_shared) &&
         StagesFitting(bm, has_shared, false) < kMinStages;
}
__host__ __device__ constexpr size_t StreamSmemBytes(int bm, bool has_shared, int stages) {
  return static_cast<size_t>(stages) * StageBytes(bm, has_shared) +
         (RedInStage(bm, has_shared) ? 0 : RedBytes(bm)) + sizeof(Barriers);
}

// BF16 results leave routed-only BM 32 four stages (FP32 ones would leave three).
static_assert(StagesFitting(32, false, false) == 4);
// The case the rule is for, and one it leaves alone.
static_assert(RedInStage(32, true));
static_assert(!RedInStage(32, false));

// The smallest MMA width covering `rows` tokens, at most BM.
__device__ __forceinline__ int MmaWidth(int rows, int bm) {
  const int n = rows <= 8 ? 8 : rows <= 16 ? 16 : rows <= 32 ? 32 : 64;
  return n < bm ? n : bm;
}

}  // namespace gcmoe::kernels::stream_role2
