// A coordinator's rank I/O region left behind: a coordinator SIGKILLed before its rank mapped
// the region cannot remove it. The next coordinator's RankIo::Create removes regions of that
// name form whose owner is gone, and nothing else.
#include "server/rank_io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

#include "common/shared_memory.h"

namespace gcmoe::server {
namespace {

bool Exists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

// Creates `name` in a child process that is SIGKILLed, then dates the segment a minute back.
void LeaveBehind(const std::string& name) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Result<std::unique_ptr<SharedMemory>> memory = SharedMemory::Create(name, 4096);
    if (!memory.ok()) _exit(3);
    raise(SIGKILL);
    _exit(4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0) << name;
  const timespec old[2] = {{time(nullptr) - 60, 0}, {time(nullptr) - 60, 0}};
  ASSERT_EQ(futimens(fd, old), 0);
  close(fd);
}

TEST(RankIoTest, CreateRemovesRegionsOfDeadCoordinatorsOnly) {
  // Named as Create names regions, and two names of other forms.
  const std::string stale = RandomSharedMemoryName(std::string(RankIo::kNamePrefix) + "-r3");
  const std::string short_name = stale.substr(0, stale.size() - 1);
  const std::string other = RandomSharedMemoryName("gcmoe_io_test");
  LeaveBehind(stale);
  LeaveBehind(short_name);
  LeaveBehind(other);

  Result<std::unique_ptr<RankIo>> io =
      RankIo::Create(0, RankIoLayout::For(4, 64, 2, RankIo::kSlots));
  ASSERT_TRUE(io.ok()) << io.status().ToString();
  EXPECT_FALSE(Exists(stale));
  EXPECT_TRUE(Exists(short_name));
  EXPECT_TRUE(Exists(other));
  EXPECT_TRUE(Exists((*io)->name())) << "its own region is live";
  shm_unlink(short_name.c_str());
  shm_unlink(other.c_str());
}

}  // namespace
}  // namespace gcmoe::server
