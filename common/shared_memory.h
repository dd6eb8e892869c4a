// A POSIX shared-memory segment mapped into this process: created by one process (owner: 0600,
// never an existing name, unlinked when the owner goes) and opened by name by another on the
// same host.
//
// An owner that is SIGKILLed cannot unlink its name, and /dev/shm is memory: in a container it
// is a small tmpfs that survives restarts. So the owner holds an exclusive flock on the segment
// for as long as it lives (the kernel drops it when the process dies, however it dies), and
// SweepStaleSharedMemory removes segments of a given name pattern whose lock nobody holds.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gcmoe {

class SharedMemory {
 public:
  // Creates `name` ("/..." as shm_open wants it) of `bytes` bytes, readable and writable by this
  // user only, zero-filled, and locked (flock) while this object lives. Fails if the name
  // exists.
  static Result<std::unique_ptr<SharedMemory>> Create(const std::string& name, size_t bytes);
  // Maps an existing segment; fails unless it is exactly `bytes` long.
  static Result<std::unique_ptr<SharedMemory>> Open(const std::string& name, size_t bytes);
  ~SharedMemory();

  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  const std::string& name() const { return name_; }
  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  SharedMemory(std::string name, uint8_t* data, size_t bytes, int lock_fd)
      : name_(std::move(name)), data_(data), bytes_(bytes), lock_fd_(lock_fd) {}

  std::string name_;
  uint8_t* data_;
  size_t bytes_;
  int lock_fd_;  // the owner's descriptor holding the flock (unlinks the name on destruction); -1
};

// A segment SweepStaleSharedMemory removed.
struct StaleSegment {
  std::string name;  // "/..." as shm_open names it
  size_t bytes = 0;
};

// Removes this user's segments whose name (without the leading '/') `matches`, that are at
// least `min_age` old (a segment is locked only just after it is created) and whose owner's
// lock nobody holds: their owner died without unlinking them. Segments of other users, of live
// owners and of other names are left alone. Where /dev/shm cannot be listed, removes nothing.
std::vector<StaleSegment> SweepStaleSharedMemory(
    const std::function<bool(std::string_view)>& matches,
    std::chrono::seconds min_age = std::chrono::seconds(10));

// "/<prefix>-<16 random hex digits>": a name no other process can predict.
std::string RandomSharedMemoryName(const std::string& prefix);

// Parts of segment names: one or more lowercase hex digits / decimal digits.
bool IsLowerHex(std::string_view text);
bool IsDecimal(std::string_view text);

}  // namespace gcmoe
