// Memory work on a call's bytes, split into chunks the coordinator's copy threads
// (server.copy_threads) share once there is enough of it: a memcpy of a T = 256 request runs at
// the speed of one core's loads and stores, several cores together move it several times faster.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/thread_pool.h"

namespace gcmoe::server {

// Work smaller than this runs on the calling thread: waking a worker costs more than it saves.
inline constexpr size_t kParallelBytes = 256 * 1024;
// The unit handed to a thread: big enough to stream, small enough to stay in its L2 for a scan
// right after the copy.
inline constexpr size_t kChunkBytes = 128 * 1024;

// Calls fn(begin, end) for chunks covering [0, size), each a multiple of `align` bytes long (but
// the last), on `pool` when size >= kParallelBytes (pool may be null: all on this thread).
void ForByteChunks(engine::ThreadPool* pool, size_t size, size_t align,
                   const std::function<void(size_t, size_t)>& fn);

// Where a copy's stores go. kCached: through this core's cache, as memcpy's do, for bytes a CPU
// reads next. kStreaming: around it (non-temporal stores), for bytes a device reads next by DMA:
// a GPU's upload of lines still dirty in a core's cache ran at 21 GB/s where the same 3 MB from
// memory ran at 50 (one H200 host, 2026-12-07; docs/PERFORMANCE.md).
enum class Stores { kCached, kStreaming };

// One memcpy of a list.
struct ByteCopy {
  uint8_t* dst = nullptr;
  const uint8_t* src = nullptr;
  size_t bytes = 0;
  Stores stores = Stores::kCached;
};

// Runs every copy, split into chunks of whole `align`-byte units; after a chunk is copied,
// then(copy index, its destination, its bytes) runs on the same thread, while they are still in
// its cache unless streamed (then may be empty). On `pool` when the copies add up to
// kParallelBytes or more. Streamed bytes are visible to other threads and devices on return.
void RunCopies(engine::ThreadPool* pool, const std::vector<ByteCopy>& copies, size_t align,
               const std::function<void(size_t, const uint8_t*, size_t)>& then = {});

}  // namespace gcmoe::server
