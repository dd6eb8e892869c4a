// Registered memory (MoeService.RegisterMemory): POSIX shared-memory objects or CUDA allocations
// a co-located frontend creates, registers once under a name of its choosing, and then names in
// Forward calls (TensorRegion) instead of sending tensor bytes through gRPC. The coordinator maps
// each shared-memory registration (PROT_READ | PROT_WRITE, MAP_SHARED), reads a call's inputs
// from it straight into the ranks' shard slots and writes its output there. A CUDA allocation is
// opened by every rank instead (Coordinator::OpenDeviceRegion): the coordinator holds its id and
// size, checks each call's ranges against them, and the ranks copy from and to it on the GPU.
//
// Trust: the mapped bytes are the client's and may change at any time. Everything the service
// reads from a region is validated exactly as inline bytes are (server/forward_validation.h),
// and the routing, which indexes arrays on the ranks, is copied out before it is validated so
// that a later write cannot bypass the check (server/forward_regions.h).
//
// Ownership: a registration belongs to the caller identity that made it (the bearer token with
// server.auth.tokens_file; one shared namespace without tokens). Another identity neither sees
// nor unregisters it: to it the name is NOT_FOUND, so the answer does not tell that it exists.
//
// Lifetime: a mapping is reference-counted. Unregister removes the name at once, and the memory
// stays mapped until the last call that resolved it has finished, so a call in flight completes
// from it; the ranks close a CUDA registration only then (DeviceRegistration's closer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "common/status.h"

namespace gcmoe::server {

// One registration's mapping of [offset, offset + byte_size) of a shared-memory object.
class MappedRegion {
 public:
  // NOT_FOUND when `key` names no object; INVALID_ARGUMENT (naming `field`) for a malformed key,
  // a key starting with "/gcmoe-" (the service's own objects), an object that is not a regular
  // shared-memory object, or one smaller than offset + byte_size.
  static Result<std::shared_ptr<MappedRegion>> Map(const std::string& field, const std::string& key,
                                                   uint64_t offset, uint64_t byte_size);
  ~MappedRegion();

  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  const std::string& key() const { return key_; }
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  // OK while the object still holds every registered byte: a client that shrinks it after
  // registering is refused (naming `field`) instead of reading past its end, which would fault.
  Status CheckStillBacked(const std::string& field) const;

 private:
  MappedRegion() = default;

  std::string key_;
  int fd_ = -1;
  void* map_base_ = nullptr;  // page-aligned start of the mapping
  size_t map_bytes_ = 0;
  uint8_t* data_ = nullptr;   // map_base_ + (offset - its page-aligned floor)
  uint64_t size_ = 0;
  uint64_t end_ = 0;  // offset + byte_size within the object
};

// A CUDA allocation every rank has opened as DeviceRegion `id`. Its last holder (the registry,
// or a call that resolved it) runs `closer`, which tells the ranks to close it.
class DeviceRegistration {
 public:
  DeviceRegistration(uint64_t id, uint64_t size, std::function<void(uint64_t)> closer)
      : id_(id), size_(size), closer_(std::move(closer)) {}
  ~DeviceRegistration() {
    if (closer_) closer_(id_);
  }
  DeviceRegistration(const DeviceRegistration&) = delete;
  DeviceRegistration& operator=(const DeviceRegistration&) = delete;

  uint64_t id() const { return id_; }
  uint64_t size() const { return size_; }

 private:
  uint64_t id_;
  uint64_t size_;
  std::function<void(uint64_t)> closer_;
};

// A resolved TensorRegion: its bytes (host memory), or its range of a DeviceRegistration, and
// what they stay valid with.
struct RegionBytes {
  uint8_t* data = nullptr;  // null for GPU memory
  size_t size = 0;
  uint64_t device_region = 0;  // GPU memory: the DeviceRegistration's id (0: host memory)
  uint64_t device_offset = 0;  // and where in it the bytes start
  std::shared_ptr<const void> mapping;
};

class MemoryRegistry {
 public:
  // Fixed bounds, not config keys: a registration costs only address space and a file
  // descriptor, and these leave room for a frontend's per-layer buffers many times over.
  static constexpr size_t kMaxRegistrations = 256;                  // all owners together
  static constexpr uint64_t kMaxRegisteredBytes = uint64_t{1} << 40;  // 1 TiB mapped in all
  static constexpr size_t kMaxNameBytes = 128;

  // ALREADY_EXISTS when `owner` already has `name`; RESOURCE_EXHAUSTED past the bounds; else as
  // MappedRegion::Map. Field names in errors are RegisterMemoryRequest's.
  Status RegisterPosixShm(const std::string& owner, const std::string& name,
                          const std::string& key, uint64_t offset, uint64_t byte_size);
  // The same bounds for GPU memory the ranks have opened. Dropping `registration` (on any error)
  // closes it on the ranks.
  Status RegisterDevice(const std::string& owner, const std::string& name,
                        std::shared_ptr<const DeviceRegistration> registration);
  // Whether `owner` may register `name` now (the checks both Register calls make first): a
  // cuda_ipc registration asks before the ranks open anything.
  Status CheckNewName(const std::string& owner, const std::string& name) const;
  // NOT_FOUND when `owner` has no registration `name`.
  Status Unregister(const std::string& owner, const std::string& name);
  // Bytes [offset, offset + byte_size) of `owner`'s registration `name`; errors name `field`
  // (e.g. "hidden.region", "output_region"): NOT_FOUND for an unknown name, INVALID_ARGUMENT for a range outside
  // the registration.
  Result<RegionBytes> Resolve(const std::string& owner, const std::string& field,
                              const std::string& name, uint64_t offset, uint64_t byte_size) const;

  size_t size() const;
  uint64_t registered_bytes() const;

 private:
  mutable std::mutex mu_;
  // One registration: exactly one of the two is set.
  struct Entry {
    std::shared_ptr<const MappedRegion> host;
    std::shared_ptr<const DeviceRegistration> device;
    uint64_t size() const { return host ? host->size() : device->size(); }
  };
  // Under mu_: both Register calls' checks of the name, the count and the bytes.
  Status CheckRoomLocked(const std::string& owner, const std::string& name, const char* field,
                         uint64_t byte_size) const;

  std::map<std::pair<std::string, std::string>, Entry> regions_;
  uint64_t registered_bytes_ = 0;
};

}  // namespace gcmoe::server
