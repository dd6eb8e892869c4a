// The sm90 weight tiles against the mma.m16n8k32 fragment contract (kernels/weight_tiles_sm90.h):
// every byte a lane reads for (stripe, chunk, scale block, row g / g+8, position) is the source
// element the fragment needs. Also the in-register E2M1 -> E4M3 decode (byte permutes) against
// numerics, with prmt emulated bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "engine/numerics.h"
#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::kernels {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// The source row of stripe row r for a gated (W1) or plain (W2) tile.
int SourceRow(bool gated, int inter, int tile, int stripe, int r) {
  if (!gated) return tile * 64 + stripe * 16 + r;
  const int feature = tile * 32 + (stripe % 2) * 16 + r;
  return stripe < 2 ? feature : inter + feature;
}

void CheckTiles(TileFormat format, bool gated, int rows_or_inter, int k) {
  const int rows = gated ? 2 * rows_or_inter : rows_or_inter;
  const int code_row = format == TileFormat::kE2M1 ? k / 2 : k;
  const auto codes = RandomBytes(static_cast<size_t>(rows) * code_row, 1);
  const auto scales = RandomBytes(static_cast<size_t>(rows) * (k / 32), 2);
  const int64_t bytes =
      gated ? GatedTilesBytes(format, rows_or_inter, k) : PlainTilesBytes(format, rows_or_inter, k);
  std::vector<uint8_t> tiles(bytes, 0xEE);
  if (gated) {
    PackGatedTiles(format, codes.data(), scales.data(), rows_or_inter, k, tiles.data());
  } else {
    PackPlainTiles(format, codes.data(), scales.data(), rows_or_inter, k, tiles.data());
  }
  const int num_tiles = gated ? rows_or_inter / 32 : rows_or_inter / 64;
  ASSERT_EQ(bytes, num_tiles * TileBytes(format, k));
  int checked = 0;
  for (int tile = 0; tile < num_tiles; ++tile) {
    for (int stripe = 0; stripe < 4; ++stripe) {
      for (int c = 0; c < k / 128; ++c) {
        const uint8_t* chunk =
            tiles.data() + tile * TileBytes(format, k) + (c * 4 + stripe) * ChunkBytes(format);
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4;
          const int t = lane % 4;
          for (int kb = 0; kb < 4; ++kb) {
            for (int half = 0; half < 2; ++half) {
              const int row = SourceRow(gated, rows_or_inter, tile, stripe, g + 8 * half);
              // What the kernels read: element i of the lane's 8 is logical position 4t + i
              // (i < 4) or 16 + 4t + i - 4 (the a0/a1 and a2/a3 registers).
              for (int i = 0; i < 8; ++i) {
                const int pos = c * 128 + kb * 32 + (i < 4 ? 4 * t + i : 16 + 4 * t + i - 4);
                uint8_t got, want;
                if (format == TileFormat::kE2M1) {
                  const uint8_t* word =
                      chunk + (kb / 2) * 512 + lane * 16 + ((kb % 2) * 2 + half) * 4;
                  got = (word[i / 2] >> (4 * (i % 2))) & 0xF;
                  want = (codes[static_cast<size_t>(row) * code_row + pos / 2] >> (4 * (pos % 2))) &
                         0xF;
                } else {
                  got = chunk[kb * 512 + lane * 16 + half * 8 + i];
                  want = codes[static_cast<size_t>(row) * code_row + pos];
                }
                ASSERT_EQ(got, want) << "tile " << tile << " stripe " << stripe << " chunk " << c
                                     << " lane " << lane << " kb " << kb << " half " << half;
                ++checked;
              }
              const uint8_t scale = chunk[ChunkPayloadBytes(format) + g * 8 + kb * 2 + half];
              ASSERT_EQ(scale, scales[static_cast<size_t>(row) * (k / 32) + c * 4 + kb]);
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, rows * k);  // every element read exactly once
}

TEST(WeightTilesSm90, GatedE2M1MatchesFragments) { CheckTiles(TileFormat::kE2M1, true, 128, 256); }
TEST(WeightTilesSm90, PlainE2M1MatchesFragments) { CheckTiles(TileFormat::kE2M1, false, 128, 384); }
TEST(WeightTilesSm90, GatedE4M3MatchesFragments) { CheckTiles(TileFormat::kE4M3, true, 64, 256); }
TEST(WeightTilesSm90, PlainE4M3MatchesFragments) { CheckTiles(TileFormat::kE4M3, false, 64, 128); }

// prmt.b32 d, a, b, c (default mode): byte n of d is byte (c >> 4n) & 7 of {b, a}, or, when bit
// 3 of that selector nibble is set, that byte's bit 7 replicated.
uint32_t Prmt(uint32_t a, uint32_t b, uint32_t c) {
  const uint64_t source = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t d = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t nibble = (c >> (4 * n)) & 0xF;
    uint32_t byte = (source >> (8 * (nibble & 7))) & 0xFF;
    if (nibble & 8) byte = (byte & 0x80) ? 0xFF : 0x00;
    d |= byte << (8 * n);
  }
  return d;
}

// device_common.cuh E2m1x4ToE4m3x4, on the host.
uint32_t E2m1x4ToE4m3x4(uint32_t nibbles) {
  const uint32_t magnitude = Prmt(0x3C383000u, 0x4C484440u, nibbles & 0x7777u);
  const uint32_t sign = Prmt(0x80808080u, 0x80808080u, nibbles & 0xFFFFu);
  return magnitude | ((sign << 7) & 0x80808080u);
}

TEST(WeightTilesSm90, E2M1ToE4M3DecodeIsExact) {
  for (uint32_t x = 0; x < 0x10000; x += 7) {
    const uint32_t out = E2m1x4ToE4m3x4(x);
    for (int i = 0; i < 4; ++i) {
      const uint8_t nibble = (x >> (4 * i)) & 0xF;
      const uint8_t code = (out >> (8 * i)) & 0xFF;
      const float want = numerics::DecodeE2M1(nibble);
      const float got = numerics::DecodeE4M3(code);
      ASSERT_EQ(got, want) << "nibble " << int(nibble);
      ASSERT_EQ(code >> 7, nibble >> 3) << "sign of nibble " << int(nibble);
    }
  }
}

}  // namespace
}  // namespace gcmoe::kernels
