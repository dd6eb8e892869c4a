// The routed and shared expert weights, re-laid out once at load for the sm90 grouped GEMM
// (grouped_gemm_fp8_fp4_sm90.cu). Host code only: it rearranges already-quantized codes and
// scales and never changes a value.
//
// A tile is 64 weight rows by the whole contraction K: four stripes of 16 rows (one mma m16
// tile each). A stripe is K/128 chunks; a chunk holds 16 rows x 128 K in the exact register
// order of mma.m16n8k32: lane l = 4g + t owns, for each 32-wide scale block kb, the 8
// contraction positions kb*32 + 8t .. kb*32 + 8t + 7 of rows g and g + 8. (The MMA's logical
// k slots 4t..4t+3 and 16+4t..16+4t+3 take physical positions 8t..8t+7; the activation
// fragment uses the same map, so every product pairs the right elements.)
//
// Chunk in memory, E2M1 (1024 + 64 bytes):
//   [piece p = 0,1][lane 0..31][16 bytes: kb=2p row g, kb=2p row g+8, kb=2p+1 row g, row g+8]
//   (4 bytes each = 8 packed nibbles, element order as stored in the source rows)
// Chunk in memory, E4M3 (2048 + 64 bytes):
//   [piece kb = 0..3][lane 0..31][16 bytes: row g (8 codes), row g + 8 (8 codes)]
// Both end with the scales: [g 0..7][kb 0..3][row g, row g + 8] (64 bytes).
// Pieces of 512 bytes make every lane's 16-byte copy coalesced across the warp and every
// shared-memory read conflict-free.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace gcmoe::kernels {

enum class TileFormat { kE2M1, kE4M3 };

inline constexpr int kChunkScaleBytes = 64;

GCMOE_HOST_DEVICE constexpr int ChunkPayloadBytes(TileFormat format) {
  return format == TileFormat::kE2M1 ? 1024 : 2048;
}
GCMOE_HOST_DEVICE constexpr int ChunkBytes(TileFormat format) {
  return ChunkPayloadBytes(format) + kChunkScaleBytes;
}
GCMOE_HOST_DEVICE constexpr int64_t StripeBytes(TileFormat format, int k) {
  return static_cast<int64_t>(k / 128) * ChunkBytes(format);
}
GCMOE_HOST_DEVICE constexpr int64_t TileBytes(TileFormat format, int k) {
  return 4 * StripeBytes(format, k);
}

// A gated W1 [2I, K] (rows 0..I-1 gate, I..2I-1 up) becomes I/32 tiles; tile j holds gate rows
// 32j..32j+31 then up rows I+32j..I+32j+31, so one tile yields 32 SwiGLU features (one scale
// block of h). codes: [2I, K/2] (E2M1) or [2I, K] (E4M3); scales: [2I, K/32].
int64_t GatedTilesBytes(TileFormat format, int inter, int k);
void PackGatedTiles(TileFormat format, const uint8_t* codes, const uint8_t* scales, int inter,
                    int k, uint8_t* dst);

// A plain [N, K] matrix (W2) becomes N/64 tiles of consecutive rows.
int64_t PlainTilesBytes(TileFormat format, int rows, int k);
void PackPlainTiles(TileFormat format, const uint8_t* codes, const uint8_t* scales, int rows, int k,
                    uint8_t* dst);

}  // namespace gcmoe::kernels
