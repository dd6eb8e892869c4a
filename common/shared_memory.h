// A POSIX shared-memory segment mapped into this process: created by one process (owner: 0600,
// never an existing name, unlinked when the owner goes) and opened by name by another on the
// same host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace gcmoe {

class SharedMemory {
 public:
  // Creates `name` ("/..." as shm_open wants it) of `bytes` bytes, readable and writable by this
  // user only, zero-filled. Fails if the name exists.
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
  SharedMemory(std::string name, uint8_t* data, size_t bytes, bool owner)
      : name_(std::move(name)), data_(data), bytes_(bytes), owner_(owner) {}

  std::string name_;
  uint8_t* data_;
  size_t bytes_;
  bool owner_;  // unlinks the name on destruction
};

// "/<prefix>-<16 random hex digits>": a name no other process can predict.
std::string RandomSharedMemoryName(const std::string& prefix);

}  // namespace gcmoe
