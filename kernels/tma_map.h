// TMA tensor maps of the BF16 activation matrices the bf16 role2 kernels read (ring, h_q, x_bf,
// hs_q): each map cuts a row-major [rows, cols] BF16 matrix into boxes that one
// cp.async.bulk.tensor copies into a stage. Two shapes:
//   - K32 boxes: 32 values (64 bytes) by kTmaRowGroup rows, unswizzled: one K32 block of 8 token
//     rows in the mma.sync kernels' B layout (stream_pipeline_sm90.cuh).
//   - K64 boxes: 64 values (128 bytes) by kTmaWideRows rows with the 128-byte swizzle: one K half
//     of 16 rows of the bf16-wgmma kernel's token block, in the K-major layout wgmma reads.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/layer_types.h"

namespace gcmoe::kernels {

inline constexpr int kTmaRowGroup = 8;
inline constexpr int kTmaWideRows = 16;  // the bf16-wgmma kernel's MMA widths are multiples

enum class TmaBox { kK32Rows8, kK64Rows16Swizzled };

// Encodes `base` ([rows, cols] BF16, row pitch cols * 2 bytes; cols a multiple of 64, base
// 16-byte aligned) into *map. cudaErrorInvalidValue when the driver lacks
// cuTensorMapEncodeTiled or rejects the shape.
cudaError_t EncodeBf16TileMap(const void* base, int64_t rows, int64_t cols, TmaBox box,
                              TmaMap* map);

}  // namespace gcmoe::kernels
