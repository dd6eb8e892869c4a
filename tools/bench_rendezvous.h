// A file-system rendezvous for the rank processes of one multi-GPU benchmark (`gcmoe bench
// ep`): each rank publishes a value under a key as a file in a shared directory and waits for
// every rank's. Also a barrier: the GPU roles' spin-waits time out after seconds, so ranks
// meet here before every step rather than at a device barrier after a slow weight load.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace gcmoe::tools {

class FileRendezvous {
 public:
  FileRendezvous(std::string directory, int rank, int world, int timeout_ms);

  // Publishes `value` as this rank's under `key`, then returns every rank's (indexed by rank).
  Result<std::vector<std::string>> AllGather(const std::string& key, const std::string& value);

 private:
  std::string directory_;
  int rank_;
  int world_;
  int timeout_ms_;
};

}  // namespace gcmoe::tools
