#include "server/memory_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>


namespace gcmoe::server {
namespace {

constexpr const char* kReservedKeyPrefix = "gcmoe-";

std::string Errno() { return std::strerror(errno); }

// Names and keys reach the log: printable ASCII only, so none can forge a log line.
bool Printable(const std::string& s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// A name as shm_open takes it: "/" then 1..254 bytes with no further "/". Names starting with
// "gcmoe-" are refused: the service's own objects (the ranks' I/O regions, the engine's
// exchange segments) carry it, and the service opens a key with its own user's rights, so a
// client must not be able to have it map them.
Status CheckKey(const std::string& field, const std::string& key) {
  if (key.size() < 2 || key.size() > 255 || key[0] != '/' ||
      key.find('/', 1) != std::string::npos || !Printable(key)) {
    return InvalidArgument(field + ": expected a POSIX shared-memory name \"/NAME\" (1 to 254 "
                           "printable ASCII bytes, no other '/')");
  }
  if (key.compare(1, std::strlen(kReservedKeyPrefix), kReservedKeyPrefix) == 0) {
    return InvalidArgument(field + ": \"" + key + "\": names starting with \"/" +
                           kReservedKeyPrefix + "\" are the service's own objects");
  }
  return Status::Ok();
}

}  // namespace

Result<std::shared_ptr<MappedRegion>> MappedRegion::Map(const std::string& field,
                                                        const std::string& key, uint64_t offset,
                                                        uint64_t byte_size) {
  GCMOE_RETURN_IF_ERROR(CheckKey(field + ".key", key));
  if (byte_size == 0) return InvalidArgument(field + ".byte_size: 0, expected at least 1 byte");
  if (offset > UINT64_MAX - byte_size) {
    return InvalidArgument(field + ".offset: offset + byte_size overflows 64 bits");
  }
  std::shared_ptr<MappedRegion> region(new MappedRegion());
  region->key_ = key;
  region->fd_ = shm_open(key.c_str(), O_RDWR, 0);
  if (region->fd_ < 0) {
    if (errno == ENOENT) {
      return NotFound(field + ".key: no shared-memory object \"" + key +
                      "\", expected one the client created with shm_open");
    }
    return InvalidArgument(field + ".key: \"" + key + "\" cannot be opened for reading and "
                           "writing: " + Errno());
  }
  struct stat st{};
  if (fstat(region->fd_, &st) != 0) {
    return InvalidArgument(field + ".key: \"" + key + "\" cannot be examined: " + Errno());
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument(field + ".key: \"" + key + "\" is not a regular shared-memory object");
  }
  const uint64_t object_bytes = static_cast<uint64_t>(st.st_size);
  region->end_ = offset + byte_size;
  if (region->end_ > object_bytes) {
    return InvalidArgument(field + ".byte_size: offset + byte_size = " +
                           std::to_string(region->end_) + " bytes, but \"" + key + "\" holds " +
                           std::to_string(object_bytes) + " bytes");
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t map_offset = offset / page * page;
  region->map_bytes_ = static_cast<size_t>(region->end_ - map_offset);
  void* base = mmap(nullptr, region->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, region->fd_,
                    static_cast<off_t>(map_offset));
  if (base == MAP_FAILED) {
    return InvalidArgument(field + ": \"" + key + "\" cannot be mapped: " + Errno());
  }
  region->map_base_ = base;
  region->data_ = static_cast<uint8_t*>(base) + (offset - map_offset);
  region->size_ = byte_size;
  return region;
}

MappedRegion::~MappedRegion() {
  if (map_base_ != nullptr) munmap(map_base_, map_bytes_);
  if (fd_ >= 0) close(fd_);
}

Status MappedRegion::CheckStillBacked(const std::string& field) const {
  struct stat st{};
  if (fstat(fd_, &st) != 0 || static_cast<uint64_t>(st.st_size) < end_) {
    return InvalidArgument(field + ": the shared-memory object \"" + key_ +
                           "\" no longer holds the registered bytes (it shrank to " +
                           std::to_string(st.st_size) + " bytes, expected at least " +
                           std::to_string(end_) + ")");
  }
  return Status::Ok();
}

Status MemoryRegistry::CheckNewName(const std::string& owner, const std::string& name) const {
  if (name.empty() || name.size() > kMaxNameBytes || !Printable(name)) {
    return InvalidArgument("name: " + std::to_string(name.size()) + " bytes, expected 1 to " +
                           std::to_string(kMaxNameBytes) + " printable ASCII bytes");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (regions_.count({owner, name}) > 0) {
    return AlreadyExists("name: \"" + name + "\" is already registered; unregister it first");
  }
  return Status::Ok();
}

Status MemoryRegistry::CheckRoomLocked(const std::string& owner, const std::string& name,
                                       const char* field, uint64_t byte_size) const {
  if (regions_.count({owner, name}) > 0) {
    return AlreadyExists("name: \"" + name + "\" is already registered; unregister it first");
  }
  if (regions_.size() >= kMaxRegistrations) {
    return ResourceExhausted("name: the service holds " + std::to_string(regions_.size()) +
                             " registrations, its limit; unregister one first");
  }
  if (byte_size > kMaxRegisteredBytes - registered_bytes_) {
    return ResourceExhausted(std::string(field) + ".byte_size: " + std::to_string(byte_size) +
                             " more bytes would exceed the service's limit of " +
                             std::to_string(kMaxRegisteredBytes) + " registered bytes (" +
                             std::to_string(registered_bytes_) + " registered)");
  }
  return Status::Ok();
}

Status MemoryRegistry::RegisterPosixShm(const std::string& owner, const std::string& name,
                                        const std::string& key, uint64_t offset,
                                        uint64_t byte_size) {
  GCMOE_RETURN_IF_ERROR(CheckNewName(owner, name));
  // Mapped outside the lock: shm_open and mmap need not hold up other calls' lookups.
  GCMOE_ASSIGN_OR_RETURN(std::shared_ptr<MappedRegion> region,
                         MappedRegion::Map("posix_shm", key, offset, byte_size));
  std::lock_guard<std::mutex> lock(mu_);
  GCMOE_RETURN_IF_ERROR(CheckRoomLocked(owner, name, "posix_shm", byte_size));
  registered_bytes_ += byte_size;
  regions_.emplace(std::make_pair(owner, name), Entry{std::move(region), nullptr});
  return Status::Ok();
}

Status MemoryRegistry::RegisterDevice(const std::string& owner, const std::string& name,
                                      std::shared_ptr<const DeviceRegistration> registration) {
  std::lock_guard<std::mutex> lock(mu_);
  GCMOE_RETURN_IF_ERROR(CheckRoomLocked(owner, name, "cuda_ipc", registration->size()));
  registered_bytes_ += registration->size();
  regions_.emplace(std::make_pair(owner, name), Entry{nullptr, std::move(registration)});
  return Status::Ok();
}

Status MemoryRegistry::Unregister(const std::string& owner, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto found = regions_.find({owner, name});
  if (found == regions_.end()) {
    return NotFound("name: \"" + name + "\" is not registered");
  }
  registered_bytes_ -= found->second.size();
  // Calls holding the mapping keep it until they finish (RegionBytes::mapping).
  regions_.erase(found);
  return Status::Ok();
}

Result<RegionBytes> MemoryRegistry::Resolve(const std::string& owner, const std::string& field,
                                            const std::string& name, uint64_t offset,
                                            uint64_t byte_size) const {
  Entry entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto found = regions_.find({owner, name});
    if (found == regions_.end()) {
      return NotFound(field + ": \"" + name +
                      "\" is not a registered region, expected a name given to RegisterMemory");
    }
    entry = found->second;
  }
  const uint64_t size = entry.size();
  if (offset > size || byte_size > size - offset) {
    return InvalidArgument(field + ": bytes [" + std::to_string(offset) + ", " +
                           std::to_string(offset) + " + " + std::to_string(byte_size) +
                           ") are outside the registration's " + std::to_string(size) + " bytes");
  }
  RegionBytes bytes;
  bytes.size = static_cast<size_t>(byte_size);
  if (entry.device) {
    bytes.device_region = entry.device->id();
    bytes.device_offset = offset;
    bytes.mapping = std::move(entry.device);
    return bytes;
  }
  GCMOE_RETURN_IF_ERROR(entry.host->CheckStillBacked(field));
  bytes.data = entry.host->data() + offset;
  bytes.mapping = std::move(entry.host);
  return bytes;
}

size_t MemoryRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return regions_.size();
}

uint64_t MemoryRegistry::registered_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registered_bytes_;
}

}  // namespace gcmoe::server
