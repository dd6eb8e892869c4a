// Shared-memory segments as a killed process leaves them, for the tests of their removal
// (common, the rank I/O regions, a service killed whole).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <string>

#include <gtest/gtest.h>

#include "common/shared_memory.h"

namespace gcmoe::testing {

inline bool SegmentExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

// Creates `name` (its first byte 1) in a child process that is then SIGKILLed, so nothing of
// its own runs to remove it; returns once the child is gone.
inline void LeaveSegmentOfKilledProcess(const std::string& name, size_t bytes) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Result<std::unique_ptr<SharedMemory>> memory = SharedMemory::Create(name, bytes);
    if (!memory.ok()) _exit(3);
    (*memory)->data()[0] = 1;
    raise(SIGKILL);
    _exit(4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;
}

// Sets the segment's modification time `age` into the past (the sweep spares young segments).
inline void AgeSegment(const std::string& name, std::chrono::seconds age) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0) << name;
  const time_t then = time(nullptr) - age.count();
  const timespec times[2] = {{then, 0}, {then, 0}};
  ASSERT_EQ(futimens(fd, times), 0);
  close(fd);
}

}  // namespace gcmoe::testing
