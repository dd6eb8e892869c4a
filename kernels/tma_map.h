// TMA tensor maps of the BF16 activation matrices role2 reads (ring, h_q, x_bf,
// hs_q): each map cuts a row-major [rows, cols] BF16 matrix into boxes that one
// cp.async.bulk.tensor copies into a stage. Two shapes:
//   - K32 boxes: 32 values (64 bytes) by a multiple of kTmaRowGroup rows, unswizzled: one K32
//     block of a block's valid 8-row groups in the mma.sync kernels' B layout
//     (stream_pipeline_sm90.cuh).
//   - K64 boxes: 64 values (128 bytes) by a multiple of kTmaWideRows rows (up to
//     kTmaWideHeights of them) with the 128-byte swizzle: one K half of a BM 64 token block's
//     valid rows (16, 32, 48 or 64) in one copy, in the K-major layout wgmma reads.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/layer_types.h"

namespace gcmoe::kernels {

inline constexpr int kTmaRowGroup = 8;
inline constexpr int kTmaWideRows = 16;  // the wgmma kernel (BM 64)'s MMA widths are multiples
// Box heights per matrix, in row groups: K32 boxes of 8..64 rows (a K32 block of a whole block
// of up to BM 64 rows), K64 boxes of 16..64 rows (a block of BM 64; a merged tail's rows come as
// one more 16-row box). One copy per K32 block or K half instead of one per row group: the
// producer warp issues each copy, and its issue latency is not hidden by a 2-stage ring (3-6 % at
// 64-256 tokens per rank).
inline constexpr int kTmaK32Heights = 8;
inline constexpr int kTmaWideHeights = 4;
// LayerParams::act_maps: per matrix its K32 maps of 1..kTmaK32Heights row groups, then per
// matrix its K64 maps of 1..kTmaWideHeights.
inline constexpr int kNumActMapSets = kNumActMaps * (kTmaK32Heights + kTmaWideHeights);
GCMOE_HOST_DEVICE constexpr int K32ActMap(ActMap matrix, int groups) {
  return matrix * kTmaK32Heights + groups - 1;
}
GCMOE_HOST_DEVICE constexpr int WideActMap(ActMap matrix, int groups) {
  return kNumActMaps * kTmaK32Heights + matrix * kTmaWideHeights + groups - 1;
}
static_assert(kTmaK32Heights * kTmaRowGroup == kBlockSizes[kNumBlockSizes - 1]);
static_assert(K32ActMap(kMapHs, kTmaK32Heights) + 1 == WideActMap(kMapRing, 1) &&
              WideActMap(kMapHs, kTmaWideHeights) + 1 == kNumActMapSets);

enum class TmaBox { kK32, kK64Swizzled };

// Encodes `base` ([rows, cols] BF16, row pitch cols * 2 bytes; cols a multiple of 64, base
// 16-byte aligned) into *map; `groups`: the box's height in row groups (kTmaRowGroup rows for
// K32 boxes, kTmaWideRows for K64).
// cudaErrorInvalidValue when the driver lacks cuTensorMapEncodeTiled or rejects the shape.
cudaError_t EncodeBf16TileMap(const void* base, int64_t rows, int64_t cols, TmaBox box, TmaMap* map,
                              int groups);

}  // namespace gcmoe::kernels
