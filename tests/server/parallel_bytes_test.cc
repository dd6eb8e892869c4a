// The coordinator's chunked copies and scans: the same bytes as one memcpy (cached or streamed
// stores), every chunk handed to `then` once with its own destination, whole units of `align`,
// on one thread below the threshold and on the pool above it.
#include "server/parallel_bytes.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/splitmix64.h"

namespace gcmoe::server {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> bytes(n);
  SplitMix64 rng(seed);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng.Next());
  return bytes;
}

TEST(ParallelBytesTest, CopiesAreThoseOfMemcpyAndEachChunkIsSeenOnce) {
  engine::ThreadPool pool(4);
  // Sizes around the threshold and the chunk, odd ones, and an empty copy.
  for (const std::vector<size_t>& sizes :
       std::vector<std::vector<size_t>>{{100, 0, 3000},
                                        {kParallelBytes - 8},
                                        {kParallelBytes},
                                        {kChunkBytes * 3 + 6, 10, kChunkBytes - 2, 4 << 20}}) {
    for (engine::ThreadPool* p : {static_cast<engine::ThreadPool*>(nullptr), &pool}) {
      for (const Stores stores : {Stores::kCached, Stores::kStreaming}) {
        std::vector<std::vector<uint8_t>> src, dst, want;
        std::vector<ByteCopy> copies;
        for (size_t i = 0; i < sizes.size(); ++i) {
          src.push_back(RandomBytes(sizes[i] + 16, 7 + i));
          dst.push_back(std::vector<uint8_t>(sizes[i] + 16, 0xEE));
        }
        for (size_t i = 0; i < sizes.size(); ++i) {
          // Offsets inside the buffers, to catch a chunk written at the wrong place.
          // Streamed copies start off the 16-byte grid and end off it (the ragged ends).
          copies.push_back(ByteCopy{dst[i].data() + 2, src[i].data() + 6, sizes[i], stores});
          want.push_back(dst[i]);
          std::memcpy(want[i].data() + 2, src[i].data() + 6, sizes[i]);
        }
        std::mutex mu;
        std::vector<std::vector<std::pair<size_t, size_t>>> seen(sizes.size());  // (offset, bytes)
        std::set<std::thread::id> threads;
        RunCopies(p, copies, 2, [&](size_t copy, const uint8_t* chunk, size_t bytes) {
          // The chunk is already there when `then` sees it.
          EXPECT_EQ(std::memcmp(chunk, src[copy].data() + 6 + (chunk - copies[copy].dst), bytes),
                    0);
          std::lock_guard<std::mutex> lock(mu);
          seen[copy].emplace_back(static_cast<size_t>(chunk - copies[copy].dst), bytes);
          threads.insert(std::this_thread::get_id());
        });
        size_t total = 0;
        for (size_t i = 0; i < sizes.size(); ++i) {
          total += sizes[i];
          EXPECT_EQ(dst[i], want[i]) << "copy " << i << " of " << sizes[i] << " bytes";
          std::sort(seen[i].begin(), seen[i].end());
          size_t next = 0;
          for (const auto& [offset, bytes] : seen[i]) {
            EXPECT_EQ(offset, next);
            EXPECT_EQ(bytes % 2 == 0 || offset + bytes == sizes[i], true) << "whole units of 2";
            next = offset + bytes;
          }
          EXPECT_EQ(next, sizes[i]) << "copy " << i << ": chunks cover it once";
        }
        if (p == nullptr || total < kParallelBytes) {
          EXPECT_EQ(threads.size(), 1u) << "small work stays on the calling thread";
        }
      }
    }
  }
}

TEST(ParallelBytesTest, ChunksCoverTheRangeInUnitsOfAlign) {
  engine::ThreadPool pool(3);
  for (size_t size : {size_t{0}, size_t{5}, kParallelBytes + 3, size_t{3} << 20}) {
    std::mutex mu;
    std::vector<std::pair<size_t, size_t>> chunks;
    ForByteChunks(&pool, size, 12, [&](size_t begin, size_t end) {
      std::lock_guard<std::mutex> lock(mu);
      chunks.emplace_back(begin, end);
    });
    std::sort(chunks.begin(), chunks.end());
    size_t next = 0;
    for (const auto& [begin, end] : chunks) {
      EXPECT_EQ(begin, next);
      EXPECT_TRUE(begin % 12 == 0) << begin;
      EXPECT_LT(begin, end);
      next = end;
    }
    EXPECT_EQ(next, size);
    if (size >= kParallelBytes) {
      EXPECT_GT(chunks.size(), 1u);
    }
  }
}

}  // namespace
}  // namespace gcmoe::server
