// The sm90 weight tiles against the mma.m16n8k32 fragment contract (kernels/weight_tiles_sm90.h):
// every code a lane decodes for (stripe, chunk, scale block, row g / g+8, position) is the source
// element the fragment needs, with the value numerics gives it. The decodes are the kernels' own
// functions (host and device), checked against numerics' E2M1 and E4M3 tables: to E4M3 bytes
// (kE2M1) and to BF16 register pairs (kE2M1Bf16).
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/numerics.h"
#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::kernels {
namespace {

// The value of code j (0..3 low run, 4..7 high run) of a kE2M1Bf16 lane word: registers {lo0,
// lo1}, {lo2, lo3}, {hi0, hi1}, {hi2, hi3}, the first code of each in the low half.
float Bf16WordValue(uint32_t word, int j) {
  return numerics::BF16ToFloat(
             static_cast<uint16_t>(DecodeE2m1Bf16Word(word).r[j / 2] >> (16 * (j % 2)))) *
         kE2m1Bf16DecodeScale;
}

// Every code in every slot of a lane word: each of the 16 codes at each of the 8 positions (0..3
// the low run, 4..7 the high one), the other 7 holding random codes (so no slot's bits leak into
// another's). `decode(lo, hi, values)` places the runs in a word and decodes all 8 values, which
// must equal numerics' E2M1 values bit for bit (signed zeros included).
template <typename Decode>
void CheckEveryCodeInEverySlot(uint32_t seed, Decode decode) {
  std::mt19937 rng(seed);
  for (int slot = 0; slot < 8; ++slot) {
    for (int code = 0; code < 16; ++code) {
      for (int trial = 0; trial < 64; ++trial) {
        uint8_t lo[4];
        uint8_t hi[4];
        for (int j = 0; j < 4; ++j) {
          lo[j] = static_cast<uint8_t>(rng() & 0xF);
          hi[j] = static_cast<uint8_t>(rng() & 0xF);
        }
        (slot < 4 ? lo[slot] : hi[slot - 4]) = static_cast<uint8_t>(code);
        float values[8];
        decode(lo, hi, values);
        for (int j = 0; j < 8; ++j) {
          const uint8_t want_code = j < 4 ? lo[j] : hi[j - 4];
          const float want = numerics::DecodeE2M1(want_code);
          ASSERT_EQ(std::bit_cast<uint32_t>(values[j]), std::bit_cast<uint32_t>(want))
              << "slot " << j << " code " << int(want_code) << " (tested slot " << slot << ")";
        }
      }
    }
  }
}

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// The source row of stripe row r for a gated (W1) or plain (W2) tile, -1 past the source's rows
// (padding).
int SourceRow(bool gated, int rows_or_inter, int tile, int stripe, int r) {
  if (!gated) {
    const int row = tile * 64 + stripe * 16 + r;
    return row < rows_or_inter ? row : -1;
  }
  const int feature = tile * 32 + (stripe % 2) * 16 + r;
  if (feature >= rows_or_inter) return -1;
  return stripe < 2 ? feature : rows_or_inter + feature;
}

// Packs a random [rows, k] source (gated: [2 inter, k]) into tiles, zero-padded to
// padded_rows_or_inter x padded_k when those are given, and checks every element a lane reads:
// the source's code and scale, or code 0 with the fill scale in the padding (TilePadding).
void CheckTiles(TileFormat format, bool gated, int rows_or_inter, int k,
                int padded_rows_or_inter = 0, int padded_k = 0) {
  const int rows = gated ? 2 * rows_or_inter : rows_or_inter;
  const int code_row = IsFp4(format) ? k / 2 : k;
  const auto codes = RandomBytes(static_cast<size_t>(rows) * code_row, 1);
  const auto scales = RandomBytes(static_cast<size_t>(rows) * (k / 32), 2);
  const TilePadding pad{padded_rows_or_inter, padded_k, 0x7B};
  const int tile_rows = pad.rows > 0 ? pad.rows : rows_or_inter;
  const int tile_k = pad.k > 0 ? pad.k : k;
  const int64_t bytes =
      gated ? GatedTilesBytes(format, tile_rows, tile_k) : PlainTilesBytes(format, tile_rows, tile_k);
  std::vector<uint8_t> tiles(bytes, 0xEE);
  if (gated) {
    PackGatedTiles(format, codes.data(), scales.data(), rows_or_inter, k, tiles.data(), pad);
  } else {
    PackPlainTiles(format, codes.data(), scales.data(), rows_or_inter, k, tiles.data(), pad);
  }
  const int num_tiles = gated ? tile_rows / 32 : tile_rows / 64;
  ASSERT_EQ(bytes, num_tiles * TileBytes(format, tile_k));
  const int k_src = k;
  k = tile_k;  // the loops below walk the tiles' K
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
                float got, want;
                if (IsFp4(format)) {
                  const uint8_t* bytes =
                      chunk + (kb / 2) * 512 + lane * 16 + ((kb % 2) * 2 + half) * 4;
                  const uint32_t word = static_cast<uint32_t>(bytes[0]) | (bytes[1] << 8) |
                                        (bytes[2] << 16) | (static_cast<uint32_t>(bytes[3]) << 24);
                  if (format == TileFormat::kE2M1Bf16) {
                    got = Bf16WordValue(word, i);
                  } else {
                    const E4m3Pair pair = DecodeE2m1Word(word);
                    const uint32_t reg = i < 4 ? pair.lo : pair.hi;
                    got = numerics::DecodeE4M3(static_cast<uint8_t>(reg >> (8 * (i % 4)))) *
                          kE2m1DecodeScale;
                  }
                  want = row < 0 || pos >= k_src
                             ? 0.0f
                             : numerics::DecodeE2M1(static_cast<uint8_t>(
                                   codes[static_cast<size_t>(row) * code_row + pos / 2] >>
                                   (4 * (pos % 2))));
                } else {
                  got = numerics::DecodeE4M3(chunk[kb * 512 + lane * 16 + half * 8 + i]);
                  want = row < 0 || pos >= k_src
                             ? 0.0f
                             : numerics::DecodeE4M3(codes[static_cast<size_t>(row) * code_row + pos]);
                }
                // Bit-equal floats: NaN codes (E4M3 only) compare by bits, signed zeros too.
                ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
                    << "tile " << tile << " stripe " << stripe << " chunk " << c << " lane " << lane
                    << " kb " << kb << " half " << half << " element " << i;
                ++checked;
              }
              const uint8_t scale = chunk[ChunkPayloadBytes(format) + g * 8 + kb * 2 + half];
              const int block = c * 4 + kb;
              ASSERT_EQ(scale, row < 0 || block >= k_src / 32
                                   ? pad.fill_scale
                                   : scales[static_cast<size_t>(row) * (k_src / 32) + block]);
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, (gated ? 2 * tile_rows : tile_rows) * k);  // every element read once
}

TEST(WeightTilesSm90, GatedE2M1MatchesFragments) { CheckTiles(TileFormat::kE2M1, true, 128, 256); }
TEST(WeightTilesSm90, PlainE2M1MatchesFragments) { CheckTiles(TileFormat::kE2M1, false, 128, 384); }
TEST(WeightTilesSm90, GatedE2M1Bf16MatchesFragments) {
  CheckTiles(TileFormat::kE2M1Bf16, true, 128, 256);
}
TEST(WeightTilesSm90, PlainE2M1Bf16MatchesFragments) {
  CheckTiles(TileFormat::kE2M1Bf16, false, 128, 384);
}
TEST(WeightTilesSm90, GatedE4M3MatchesFragments) { CheckTiles(TileFormat::kE4M3, true, 64, 256); }
TEST(WeightTilesSm90, PlainE4M3MatchesFragments) { CheckTiles(TileFormat::kE4M3, false, 64, 128); }

// H, I or I_s of 32-multiples that are not 128-multiples (gpt-oss: 2880 = 22.5 x 128) packed at
// the next multiple of 128: the padding rows and K positions decode to exactly 0.
TEST(WeightTilesSm90, GatedE2M1Bf16PaddedMatchesFragments) {
  CheckTiles(TileFormat::kE2M1Bf16, true, 96, 160, 128, 256);
}
TEST(WeightTilesSm90, PlainE2M1Bf16PaddedMatchesFragments) {
  CheckTiles(TileFormat::kE2M1Bf16, false, 160, 96, 192, 128);
}
TEST(WeightTilesSm90, GatedE4M3PaddedMatchesFragments) {
  CheckTiles(TileFormat::kE4M3, true, 224, 160, 256, 256);
}
TEST(WeightTilesSm90, PlainE4M3PaddedMatchesFragments) {
  CheckTiles(TileFormat::kE4M3, false, 160, 224, 192, 256);
}

// The E4M3 placement: each code decodes to the E4M3 byte of its value times 2^-6.
TEST(WeightTilesSm90, LaneWordDecodeIsExactForEveryCodeInEverySlot) {
  CheckEveryCodeInEverySlot(7, [](const uint8_t(&lo)[4], const uint8_t(&hi)[4], float* values) {
    const E4m3Pair pair = DecodeE2m1Word(PlaceE2m1Word(lo, hi));
    for (int j = 0; j < 8; ++j) {
      const uint8_t e4m3 = static_cast<uint8_t>((j < 4 ? pair.lo : pair.hi) >> (8 * (j % 4)));
      values[j] = numerics::DecodeE4M3(e4m3) * kE2m1DecodeScale;
    }
  });
}

// The BF16 placement: every register pair is the BF16 of its two codes' values times 2^-126,
// exactly (0.5 as a BF16 subnormal included), and nothing but the pattern bits.
TEST(WeightTilesSm90, Bf16LaneWordDecodeIsExactForEveryCodeInEverySlot) {
  CheckEveryCodeInEverySlot(8, [](const uint8_t(&lo)[4], const uint8_t(&hi)[4], float* values) {
    const uint32_t word = PlaceE2m1Bf16Word(lo, hi);
    for (int j = 0; j < 8; ++j) values[j] = Bf16WordValue(word, j);
    for (const uint32_t reg : DecodeE2m1Bf16Word(word).r) ASSERT_EQ(reg & ~kBf16PairMask, 0u);
  });
}

}  // namespace
}  // namespace gcmoe::kernels
