// The routed and shared expert weights, re-laid out once at load for the sm90 grouped GEMM
// (grouped_gemm_sm90.cu). Host code only: it rearranges already-quantized codes and
// scales and never changes a value.
//
// A tile is 64 weight rows by the whole contraction K: four stripes of 16 rows (one m16 slice
// each: an mma.m16n8k32 A tile, or warp w's rows of a wgmma m64nNk32 A fragment, which has the
// same per-warp register layout), K/128 chunks each, stored chunk-major: chunk c of stripes
// 0..3, then chunk c + 1, ... So the K128 step of the whole tile (4 chunks, 4352 bytes E2M1)
// is one contiguous burst and a tile streams front to back. A chunk holds 16 rows x 128 K in
// register order: lane l = 4g + t owns, for each 32-wide scale block kb, the logical
// contraction positions kb*32 + 4t .. 4t+3 (register a0/a1) and kb*32 + 16 + 4t .. 4t+3
// (a2/a3) of rows g and g + 8. Positions are the source's own (logical) order, so the
// activation operand needs no permutation: a K-major activation row in shared memory is what
// wgmma's B descriptor reads, and the mma.sync B fragment loads 4 bytes at 4t and 16 + 4t.
//
// Chunk in memory, E2M1 (1024 + 64 bytes):
//   [piece p = 0,1][lane 0..31][16 bytes: kb=2p row g, kb=2p row g+8, kb=2p+1 row g, row g+8]
//   (4 bytes each: one lane word, 8 codes: 4 for positions 4t.., then 4 for 16+4t..; the bits
//   of a word are placed for the register decode below, not stored as nibbles)
// Chunk in memory, E4M3 (2048 + 64 bytes):
//   [piece kb = 0..3][lane 0..31][16 bytes: row g (4 codes at 4t.., 4 at 16+4t..), row g + 8]
// Both end with the scales: [g 0..7][kb 0..3][row g, row g + 8] (64 bytes).
// Pieces of 512 bytes make every lane's 16-byte copy coalesced across the warp and every
// shared-memory read conflict-free.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace gcmoe::kernels {

enum class TileFormat {
  kE2M1,      // FP4, lane words placed for the E4M3 decode (the mma.sync and FP8 wgmma role2)
  kE2M1Bf16,  // FP4, lane words placed for the BF16 decode: same bytes per chunk
  kE4M3,      // FP8 (the shared expert), one byte per code
};
GCMOE_HOST_DEVICE constexpr bool IsFp4(TileFormat format) { return format != TileFormat::kE4M3; }

GCMOE_HOST_DEVICE constexpr uint32_t RotateRight(uint32_t w, int r) {
  return r == 0 ? w : (w >> r) | (w << (32 - r));
}

// ---- lane words: E2M1 codes placed where E4M3 wants them --------------------------------------
//
// An E2M1 code s e1 e0 m, its bits moved to E4M3 bits 7, 4, 3, 2 (sign, the two exponent LSBs,
// the mantissa MSB), is exactly the E4M3 code of its value times 2^-6: the normal codes keep
// their exponent field with bias 7 instead of 1, and 0.5 becomes the E4M3 subnormal 2^-7. So a
// decode is a mask, and the 2^6 is paid once on the FP32 result (kE2m1DecodeScale).
//
// A lane word holds the 4 codes of the low run (positions 4t..4t+3) in its E4M3 bit positions
// {7, 4, 3, 2} of bytes 0..3, and the 4 codes of the high run (16+4t..) in the remaining bits,
// placed so that one rotation and one shift bring them to the same positions:
//   byte j: bit 7 s  lo[j]   bit 6 e1 hi[j]   bit 5 e0 hi[j]   bits 4,3,2 e1 e0 m lo[j]
//           bit 1 s  hi[j-1 mod 4]            bit 0 m  hi[j]
// Decode (5 integer instructions for 8 codes; the byte-permute table lookup it replaced took 11):
//   lo = w & 0x9C9C9C9C
//   hi = (rotr(w, 2) & 0x98989898) | ((w << 2) & 0x04040404)
inline constexpr float kE2m1DecodeScale = 64.0f;

GCMOE_HOST_DEVICE constexpr uint32_t PlaceE2m1Word(const uint8_t (&lo)[4], const uint8_t (&hi)[4]) {
  uint32_t w = 0;
  for (int j = 0; j < 4; ++j) {
    const uint32_t l = lo[j] & 0xFu;
    const uint32_t h = hi[j] & 0xFu;
    const uint32_t byte = ((l & 8u) << 4) | ((l & 7u) << 2) | (((h >> 1) & 3u) << 5) | (h & 1u);
    w |= byte << (8 * j);
    w |= ((h >> 3) & 1u) << (8 * ((j + 1) % 4) + 1);
  }
  return w;
}

// The E4M3 codes (times 2^-6) of a lane word's low and high runs: byte j is position j.
struct E4m3Pair {
  uint32_t lo;
  uint32_t hi;
};
GCMOE_HOST_DEVICE inline E4m3Pair DecodeE2m1Word(uint32_t w) {
  const uint32_t rotated = (w >> 2) | (w << 30);
  return {w & 0x9C9C9C9Cu, (rotated & 0x98989898u) | ((w << 2) & 0x04040404u)};
}

// ---- lane words for the BF16 decode (TileFormat::kE2M1Bf16) -----------------------------------
//
// The same 8 codes per lane word, placed so that each register of the wgmma m64nNk16 BF16 A
// fragment comes out of a mask of the word, a rotation or a left shift. A register holds two
// codes of one row at consecutive fragment columns; the low-run positions 4t..4t+3 are columns
// 2t, 2t+1 (first register) and 2t+8, 2t+9 (second) of the K16 step of the run, the high run the
// same in the next K16 step (the activations are stored in that column order: bf16_operands.h).
// A code s e1 e0 m at BF16 bits 15, 8, 7, 6 of its half is the BF16 of its value times 2^-126:
// normal codes keep their exponent field, 0.5 becomes the subnormal 2^-127. The block scale's
// BF16 multiply (bf16_operands.h) then gives the exact weight.
//   {lo0, lo1} = w & P                {lo2, lo3} = rotr(w, 4) & P
//   {hi0, hi1} = (w << 6) & P         {hi2, hi3} = (rotr(w, 6) & Pa) | ((w << 2) & Pb)
// P = 0x81C081C0 (bits 15, 8, 7, 6 of both halves). No four rotations of P tile the 32 bits (an
// exhaustive search), so the last register takes two moves. The two left shifts are a multiply
// by a power of two, which ptxas may issue on the FMA pipe (IMAD.SHL) rather than the ALU pipe
// that the masks and rotations share: 7 ALU instructions for 8 codes, where four rotations take 9.
inline constexpr uint32_t kBf16PairMask = 0x81C081C0u;
inline constexpr uint32_t kBf16PairMaskA = 0x01000100u;  // the last register's bits from rotr 6
inline constexpr uint32_t kBf16PairMaskB = 0x80C080C0u;  // and from the shift by 2
static_assert((kBf16PairMaskA | kBf16PairMaskB) == kBf16PairMask &&
              (kBf16PairMaskA & kBf16PairMaskB) == 0);
inline constexpr float kE2m1Bf16DecodeScale = 0x1p126f;

// BF16 bits (times 2^-126) of an E2M1 code, and of two in one register (`first` low).
GCMOE_HOST_DEVICE constexpr uint32_t E2m1Bf16Bits(uint32_t code) {
  return ((code & 8u) << 12) | ((code & 7u) << 6);
}
GCMOE_HOST_DEVICE constexpr uint32_t E2m1Bf16Pair(uint32_t first, uint32_t second) {
  return E2m1Bf16Bits(first) | (E2m1Bf16Bits(second) << 16);
}

// The inverse of the decode below: each register's bits moved back to where it reads them (P's
// bits are all >= 6, so the left shifts lose none).
GCMOE_HOST_DEVICE constexpr uint32_t PlaceE2m1Bf16Word(const uint8_t (&lo)[4],
                                                       const uint8_t (&hi)[4]) {
  const uint32_t hi23 = E2m1Bf16Pair(hi[2], hi[3]);
  return E2m1Bf16Pair(lo[0], lo[1]) | RotateRight(E2m1Bf16Pair(lo[2], lo[3]), 28) |
         (E2m1Bf16Pair(hi[0], hi[1]) >> 6) | RotateRight(hi23 & kBf16PairMaskA, 26) |
         ((hi23 & kBf16PairMaskB) >> 2);
}

// The four BF16x2 registers (times 2^-126) of a lane word: {lo0, lo1}, {lo2, lo3}, {hi0, hi1},
// {hi2, hi3}.
struct Bf16Quad {
  uint32_t r[4];
};
GCMOE_HOST_DEVICE inline Bf16Quad DecodeE2m1Bf16Word(uint32_t w) {
  return {{w & kBf16PairMask, RotateRight(w, 4) & kBf16PairMask, (w << 6) & kBf16PairMask,
           (RotateRight(w, 6) & kBf16PairMaskA) | ((w << 2) & kBf16PairMaskB)}};
}

inline constexpr int kChunkScaleBytes = 64;

GCMOE_HOST_DEVICE constexpr int ChunkPayloadBytes(TileFormat format) {
  return IsFp4(format) ? 1024 : 2048;
}
GCMOE_HOST_DEVICE constexpr int ChunkBytes(TileFormat format) {
  return ChunkPayloadBytes(format) + kChunkScaleBytes;
}
// Chunk c of stripe w starts at (c * 4 + w) * ChunkBytes(format) in its tile.
GCMOE_HOST_DEVICE constexpr int64_t TileBytes(TileFormat format, int k) {
  return static_cast<int64_t>(k / 128) * 4 * ChunkBytes(format);
}

// Zero padding of a matrix whose rows (features) or K are not multiples of the tiles' 64 / 128
// (DESIGN.md §6): the tiles are packed at the padded sizes, every code past the source's rows or
// K is zero, and its block scale is `fill_scale`, a code the matrix already has, so the padding
// widens no scale range (CudaBackend's BF16 scale bound) and contributes exactly 0 to each sum.
// rows / k of 0: no padding on that side.
struct TilePadding {
  int rows = 0;  // padded I (gated) or N (plain)
  int k = 0;     // padded K, a multiple of 128
  uint8_t fill_scale = 127;
};

// A gated W1 [2I, K] (rows 0..I-1 gate, I..2I-1 up) becomes I/32 tiles; tile j holds gate rows
// 32j..32j+31 then up rows I+32j..I+32j+31, so one tile yields 32 SwiGLU features (one scale
// block of h). codes: [2I, K/2] (E2M1) or [2I, K] (E4M3); scales: [2I, K/32]. The sizes of
// GatedTilesBytes are the padded ones.
int64_t GatedTilesBytes(TileFormat format, int inter, int k);
void PackGatedTiles(TileFormat format, const uint8_t* codes, const uint8_t* scales, int inter,
                    int k, uint8_t* dst, const TilePadding& pad = {});

// A plain [N, K] matrix (W2) becomes N/64 tiles of consecutive rows.
int64_t PlainTilesBytes(TileFormat format, int rows, int k);
void PackPlainTiles(TileFormat format, const uint8_t* codes, const uint8_t* scales, int rows, int k,
                    uint8_t* dst, const TilePadding& pad = {});

}  // namespace gcmoe::kernels
