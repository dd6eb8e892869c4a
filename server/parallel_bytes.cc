#include "server/parallel_bytes.h"

#include <algorithm>
#include <cstring>

namespace gcmoe::server {
namespace {

// The chunk length: kChunkBytes rounded down to whole units of `align`.
size_t ChunkLength(size_t align) {
  align = std::max<size_t>(align, 1);
  return std::max(align, kChunkBytes / align * align);
}

bool Parallel(const engine::ThreadPool* pool, size_t bytes) {
  return pool != nullptr && pool->size() > 1 && bytes >= kParallelBytes;
}

}  // namespace

void ForByteChunks(engine::ThreadPool* pool, size_t size, size_t align,
                   const std::function<void(size_t, size_t)>& fn) {
  if (size == 0) return;
  if (!Parallel(pool, size)) {
    fn(0, size);
    return;
  }
  const size_t chunk = ChunkLength(align);
  const int64_t chunks = static_cast<int64_t>((size + chunk - 1) / chunk);
  pool->ParallelFor(chunks, [&](int64_t c, int) {
    const size_t begin = static_cast<size_t>(c) * chunk;
    fn(begin, std::min(size, begin + chunk));
  });
}

void RunCopies(engine::ThreadPool* pool, const std::vector<ByteCopy>& copies, size_t align,
               const std::function<void(size_t, const uint8_t*, size_t)>& then) {
  size_t total = 0;
  for (const ByteCopy& c : copies) total += c.bytes;
  if (!Parallel(pool, total)) {
    for (size_t i = 0; i < copies.size(); ++i) {
      if (copies[i].bytes == 0) continue;
      std::memcpy(copies[i].dst, copies[i].src, copies[i].bytes);
      if (then) then(i, copies[i].dst, copies[i].bytes);
    }
    return;
  }
  // Each chunk is (copy, offset): the copies' chunks in order.
  const size_t chunk = ChunkLength(align);
  std::vector<std::pair<size_t, size_t>> chunks;
  for (size_t i = 0; i < copies.size(); ++i) {
    for (size_t offset = 0; offset < copies[i].bytes; offset += chunk)
      chunks.emplace_back(i, offset);
  }
  pool->ParallelFor(static_cast<int64_t>(chunks.size()), [&](int64_t c, int) {
    const auto [i, offset] = chunks[static_cast<size_t>(c)];
    const ByteCopy& copy = copies[i];
    const size_t bytes = std::min(chunk, copy.bytes - offset);
    std::memcpy(copy.dst + offset, copy.src + offset, bytes);
    if (then) then(i, copy.dst + offset, bytes);
  });
}

}  // namespace gcmoe::server
