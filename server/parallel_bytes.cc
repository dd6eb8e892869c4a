#include "server/parallel_bytes.h"

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace gcmoe::server {
namespace {

// The chunk length: kChunkBytes rounded down to whole units of `align`.
size_t ChunkLength(size_t align) {
  align = std::max<size_t>(align, 1);
  return std::max(align, kChunkBytes / align * align);
}

// memcpy, or with stores that bypass the cache (16-byte ones from the first 16-byte aligned
// destination byte; the ragged ends through memcpy), fenced so that they are visible before
// anything this thread stores next (the pool's completion, then the caller's doorbell).
void CopyBytes(uint8_t* dst, const uint8_t* src, size_t n, Stores stores) {
#if defined(__SSE2__)
  if (stores == Stores::kStreaming) {
    const size_t head = std::min(n, (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
    std::memcpy(dst, src, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(dst + i, src + i, n - i);
    _mm_sfence();
    return;
  }
#endif
  std::memcpy(dst, src, n);
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
      CopyBytes(copies[i].dst, copies[i].src, copies[i].bytes, copies[i].stores);
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
    CopyBytes(copy.dst + offset, copy.src + offset, bytes, copy.stores);
    if (then) then(i, copy.dst + offset, bytes);
  });
}

}  // namespace gcmoe::server
