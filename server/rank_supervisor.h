// `gcmoe serve`'s children: one rank process per rank, restarted when one dies.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace gcmoe::server {

class RankSupervisor {
 public:
  // args[r] is rank r's argv after the executable ("rank", "--rank", "r", ...).
  RankSupervisor(std::string executable, std::vector<std::vector<std::string>> args,
                 bool restart, std::chrono::milliseconds restart_backoff);
  ~RankSupervisor();

  Status StartAll();
  // A rank that exited with a start-up error (codes 1-3: bad config, bad weights, refused):
  // restarting it would fail the same way, so serve stops instead. Ok while none has.
  Status fatal() const;
  pid_t pid(int rank) const;
  // From now on a rank that exits stays down (the service is shutting down).
  void StopRestarts();
  // SIGTERM to every child, SIGKILL to those still alive after `grace`.
  void StopAll(std::chrono::milliseconds grace);

 private:
  struct Child {
    pid_t pid = -1;
    std::chrono::steady_clock::time_point restart_at{};
    int starts = 0;
  };
  Status Spawn(int rank);
  void ReapLoop();

  const std::string executable_;
  const std::vector<std::vector<std::string>> args_;
  const bool restart_;
  const std::chrono::milliseconds backoff_;
  mutable std::mutex mu_;
  std::vector<Child> children_;
  Status fatal_;
  bool stopping_ = false;
  bool restarts_stopped_ = false;
  std::thread reaper_;
};

// The running executable's path (for re-executing itself as a rank).
std::string SelfExecutable();

}  // namespace gcmoe::server
