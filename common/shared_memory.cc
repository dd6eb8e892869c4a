#include "common/shared_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

namespace gcmoe {
namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

Result<std::unique_ptr<SharedMemory>> SharedMemory::Create(const std::string& name, size_t bytes) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return InvalidArgument("shared memory: \"" + name + "\" is not a segment name");
  }
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return Unavailable(Errno("shared memory: creating " + name));
  // Nobody else can hold a lock on a segment created a moment ago.
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const Status s = Unavailable(Errno("shared memory: locking " + name));
    close(fd);
    shm_unlink(name.c_str());
    return s;
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const Status s = Unavailable(
        Errno("shared memory: sizing " + name + " to " + std::to_string(bytes) + " bytes"));
    close(fd);
    shm_unlink(name.c_str());
    return s;
  }
  void* addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    const Status s = Unavailable(Errno("shared memory: mapping " + name));
    close(fd);
    shm_unlink(name.c_str());
    return s;
  }
  return std::unique_ptr<SharedMemory>(
      new SharedMemory(name, static_cast<uint8_t*>(addr), bytes, /*lock_fd=*/fd));
}

Result<std::unique_ptr<SharedMemory>> SharedMemory::Open(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return Unavailable(Errno("shared memory: opening " + name));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    return FailedPrecondition("shared memory: " + name + " holds " +
                              std::to_string(static_cast<int64_t>(st.st_size)) +
                              " bytes, expected " + std::to_string(bytes));
  }
  void* addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (addr == MAP_FAILED) return Unavailable(Errno("shared memory: mapping " + name));
  return std::unique_ptr<SharedMemory>(
      new SharedMemory(name, static_cast<uint8_t*>(addr), bytes, /*lock_fd=*/-1));
}

SharedMemory::~SharedMemory() {
  munmap(data_, bytes_);
  if (lock_fd_ >= 0) {
    shm_unlink(name_.c_str());
    close(lock_fd_);
  }
}

std::vector<StaleSegment> SweepStaleSharedMemory(
    const std::function<bool(std::string_view)>& matches, std::chrono::seconds min_age) {
  std::vector<StaleSegment> removed;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return removed;
  const time_t now = time(nullptr);
  while (const dirent* entry = readdir(dir)) {
    const std::string_view base(entry->d_name);
    if (base == "." || base == ".." || !matches(base)) continue;
    const std::string name = "/" + std::string(base);
    const int fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW, 0);
    if (fd < 0) continue;  // gone already, or not ours to open
    struct stat st {};
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
        now - st.st_mtime >= min_age.count() && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        shm_unlink(name.c_str()) == 0) {
      removed.push_back({name, static_cast<size_t>(st.st_size)});
    }
    close(fd);
  }
  closedir(dir);
  return removed;
}

bool IsLowerHex(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

bool IsDecimal(std::string_view text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string RandomSharedMemoryName(const std::string& prefix) {
  std::random_device device;
  const uint64_t bits = (static_cast<uint64_t>(device()) << 32) ^ device();
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(bits));
  return "/" + prefix + "-" + hex;
}

}  // namespace gcmoe
