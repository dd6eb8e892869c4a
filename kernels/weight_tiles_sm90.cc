#include "kernels/weight_tiles_sm90.h"

#include <cstring>

namespace gcmoe::kernels {
namespace {

// E2M1 code of element `pos` of a packed row (two per byte, element 2i in the low nibble).
uint8_t Nibble(const uint8_t* row, int pos) {
  return static_cast<uint8_t>((row[pos / 2] >> (4 * (pos % 2))) & 0xF);
}

// One stripe: 16 source rows (their code and scale rows; null past the source's rows) over the
// whole contraction, the source's k_src positions of the padded k; its chunk c goes to
// dst + c * 4 chunks (the tile interleaves the four stripes chunk by chunk). Positions a row
// lacks get code 0 and scale `fill_scale` (TilePadding).
void PackStripe(TileFormat format, const uint8_t* const* code_rows,
                const uint8_t* const* scale_rows, int k_src, int k, uint8_t fill_scale,
                uint8_t* dst) {
  const int payload = ChunkPayloadBytes(format);
  for (int c = 0; c < k / 128; ++c) {
    uint8_t* chunk = dst + static_cast<int64_t>(c) * 4 * ChunkBytes(format);
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2;
      const int t = lane & 3;
      for (int kb = 0; kb < 4; ++kb) {
        // The lane's two runs of 4 logical positions (registers a0/a1, then a2/a3).
        const int lo = c * 128 + kb * 32 + 4 * t;
        const int hi = lo + 16;
        // A scale block lies wholly inside the source or wholly in the padding (k_src % 32 == 0).
        const bool in_k = lo < k_src;
        for (int half = 0; half < 2; ++half) {
          // null: padding, zero codes.
          const uint8_t* row = in_k ? code_rows[g + 8 * half] : nullptr;
          if (IsFp4(format)) {
            // piece kb/2, then (kb%2, half) lane words of 4 bytes, one per (row, both runs).
            uint8_t* out = chunk + (kb / 2) * 512 + lane * 16 + (kb % 2) * 8 + half * 4;
            uint8_t lo_codes[4];
            uint8_t hi_codes[4];
            for (int i = 0; i < 4; ++i) {
              lo_codes[i] = row != nullptr ? Nibble(row, lo + i) : 0;
              hi_codes[i] = row != nullptr ? Nibble(row, hi + i) : 0;
            }
            const uint32_t word = format == TileFormat::kE2M1Bf16
                                      ? PlaceE2m1Bf16Word(lo_codes, hi_codes)
                                      : PlaceE2m1Word(lo_codes, hi_codes);
            for (int b = 0; b < 4; ++b) out[b] = static_cast<uint8_t>(word >> (8 * b));
          } else {
            uint8_t* out = chunk + kb * 512 + lane * 16 + half * 8;
            if (row != nullptr) {
              std::memcpy(out, row + lo, 4);
              std::memcpy(out + 4, row + hi, 4);
            } else {
              std::memset(out, 0, 8);
            }
          }
        }
      }
    }
    uint8_t* scales = chunk + payload;
    for (int g = 0; g < 8; ++g) {
      for (int kb = 0; kb < 4; ++kb) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t* row = scale_rows[g + 8 * half];
          const int block = c * 4 + kb;
          scales[g * 8 + kb * 2 + half] =
              row != nullptr && block < k_src / 32 ? row[block] : fill_scale;
        }
      }
    }
  }
}

// Packs tile after tile; row_of(tile, stripe, r) names the source row of each stripe row, or -1
// for a padding row. k_src: the source's K; k: the tiles' (padded) K.
template <typename RowOf>
void PackTiles(TileFormat format, const uint8_t* codes, const uint8_t* scales, int num_tiles,
               int k_src, int k, uint8_t fill_scale, RowOf row_of, uint8_t* dst) {
  const int64_t code_row_bytes = IsFp4(format) ? k_src / 2 : k_src;
  const int64_t scale_row_bytes = k_src / 32;
  const uint8_t* code_rows[16];
  const uint8_t* scale_rows[16];
  for (int tile = 0; tile < num_tiles; ++tile) {
    for (int stripe = 0; stripe < 4; ++stripe) {
      for (int r = 0; r < 16; ++r) {
        const int64_t row = row_of(tile, stripe, r);
        code_rows[r] = row < 0 ? nullptr : codes + row * code_row_bytes;
        scale_rows[r] = row < 0 ? nullptr : scales + row * scale_row_bytes;
      }
      PackStripe(format, code_rows, scale_rows, k_src, k, fill_scale,
                 dst + static_cast<int64_t>(tile) * TileBytes(format, k) +
                     static_cast<int64_t>(stripe) * ChunkBytes(format));
    }
  }
}

}  // namespace

int64_t GatedTilesBytes(TileFormat format, int inter, int k) {
  return static_cast<int64_t>(inter / 32) * TileBytes(format, k);
}

void PackGatedTiles(TileFormat format, const uint8_t* codes, const uint8_t* scales, int inter,
                    int k, uint8_t* dst, const TilePadding& pad) {
  const int padded_inter = pad.rows > 0 ? pad.rows : inter;
  PackTiles(
      format, codes, scales, padded_inter / 32, k, pad.k > 0 ? pad.k : k, pad.fill_scale,
      [inter](int tile, int stripe, int r) {
        const int feature = tile * 32 + (stripe % 2) * 16 + r;
        if (feature >= inter) return -1;
        return stripe < 2 ? feature : inter + feature;  // gate stripes, then up stripes
      },
      dst);
}

int64_t PlainTilesBytes(TileFormat format, int rows, int k) {
  return static_cast<int64_t>(rows / 64) * TileBytes(format, k);
}

void PackPlainTiles(TileFormat format, const uint8_t* codes, const uint8_t* scales, int rows, int k,
                    uint8_t* dst, const TilePadding& pad) {
  const int padded_rows = pad.rows > 0 ? pad.rows : rows;
  PackTiles(
      format, codes, scales, padded_rows / 64, k, pad.k > 0 ? pad.k : k, pad.fill_scale,
      [rows](int tile, int stripe, int r) {
        const int row = tile * 64 + stripe * 16 + r;
        return row < rows ? row : -1;
      },
      dst);
}

}  // namespace gcmoe::kernels
