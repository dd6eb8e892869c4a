// The registry of registered memory on its own: a mapping lives as long as its last holder, so a
// region unregistered while a call holds it stays readable and is unmapped when that call lets
// go; owners do not see each other's names; the bounds and the range checks.
#include "server/memory_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace gcmoe::server {
namespace {

// A shared-memory object of `bytes` bytes, each byte its offset mod 251.
class Object {
 public:
  explicit Object(size_t bytes) : key_("/gcmoe_test-registry-" + std::to_string(getpid())) {
    shm_unlink(key_.c_str());
    const int fd = shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    for (size_t i = 0; i < bytes; ++i) {
      const auto b = static_cast<uint8_t>(i % 251);
      EXPECT_EQ(pwrite(fd, &b, 1, static_cast<off_t>(i)), 1);
    }
    close(fd);
  }
  ~Object() { shm_unlink(key_.c_str()); }
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

// Whether this process maps the object named `key` (/proc/self/maps names it /dev/shm/...).
bool Mapped(const std::string& key) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/dev/shm" + key) != std::string::npos) return true;
  }
  return false;
}

TEST(MemoryRegistryTest, AnUnregisteredRegionStaysMappedUntilItsLastHolderLetsGo) {
  Object object(3 * 4096);
  MemoryRegistry registry;
  // Not page-aligned: the registration starts 100 bytes into the object.
  ASSERT_TRUE(registry.RegisterPosixShm("", "r", object.key(), 100, 8000).ok());
  EXPECT_EQ(registry.size(), 1u);
  EXPECT_EQ(registry.registered_bytes(), 8000u);
  Result<RegionBytes> held = registry.Resolve("", "hidden.region", "r", 10, 50);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(held->size, 50u);
  EXPECT_EQ(held->data[0], (100 + 10) % 251);

  ASSERT_TRUE(registry.Unregister("", "r").ok());
  EXPECT_EQ(registry.size(), 0u);
  EXPECT_EQ(registry.registered_bytes(), 0u);
  EXPECT_EQ(registry.Resolve("", "hidden.region", "r", 0, 1).status().code(),
            StatusCode::kNotFound);
  // The holder (a call in flight) still reads the bytes, from the mapping it holds.
  EXPECT_TRUE(Mapped(object.key()));
  EXPECT_EQ(held->data[49], (100 + 10 + 49) % 251);
  *held = RegionBytes{};  // the call ends
  EXPECT_FALSE(Mapped(object.key()));
}

TEST(MemoryRegistryTest, OwnersHaveSeparateNamespaces) {
  Object object(4096);
  MemoryRegistry registry;
  ASSERT_TRUE(registry.RegisterPosixShm("alice", "r", object.key(), 0, 4096).ok());
  EXPECT_EQ(registry.RegisterPosixShm("alice", "r", object.key(), 0, 4096).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.Resolve("bob", "f", "r", 0, 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(registry.Unregister("bob", "r").code(), StatusCode::kNotFound);
  EXPECT_TRUE(registry.RegisterPosixShm("bob", "r", object.key(), 0, 1024).ok());
  EXPECT_EQ(registry.size(), 2u);
  EXPECT_TRUE(registry.Unregister("alice", "r").ok());
  EXPECT_TRUE(registry.Resolve("bob", "f", "r", 0, 1024).ok());
}

TEST(MemoryRegistryTest, RangesAreCheckedAgainstTheRegistration) {
  Object object(4096);
  MemoryRegistry registry;
  ASSERT_TRUE(registry.RegisterPosixShm("", "r", object.key(), 1024, 2048).ok());
  EXPECT_TRUE(registry.Resolve("", "f", "r", 0, 2048).ok());
  EXPECT_TRUE(registry.Resolve("", "f", "r", 2047, 1).ok());
  for (auto [offset, bytes] : {std::pair<uint64_t, uint64_t>{0, 2049}, {2048, 1}, {2049, 0},
                               {~uint64_t{0}, 2}, {1, ~uint64_t{0}}}) {
    const Status status = registry.Resolve("", "topk_ids.region", "r", offset, bytes).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << offset << " + " << bytes;
    EXPECT_EQ(status.message().rfind("topk_ids.region: bytes [", 0), 0u) << status.message();
  }
  // The registration itself must lie within the object.
  EXPECT_EQ(registry.RegisterPosixShm("", "past", object.key(), 4000, 97).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.RegisterPosixShm("", "wrap", object.key(), ~uint64_t{0}, 2).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gcmoe::server
