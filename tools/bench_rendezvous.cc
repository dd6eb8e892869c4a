#include "tools/bench_rendezvous.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

namespace gcmoe::tools {

FileRendezvous::FileRendezvous(std::string directory, int rank, int world, int timeout_ms)
    : directory_(std::move(directory)), rank_(rank), world_(world), timeout_ms_(timeout_ms) {}

Result<std::vector<std::string>> FileRendezvous::AllGather(const std::string& key,
                                                           const std::string& value) {
  const auto path = [&](int rank) { return directory_ + "/" + key + "." + std::to_string(rank); };
  {
    // Written aside and renamed, so a reader sees all of it or nothing.
    const std::string partial = path(rank_) + ".partial";
    std::ofstream out(partial, std::ios::binary);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    if (!out || std::rename(partial.c_str(), path(rank_).c_str()) != 0) {
      return Internal("rendezvous: cannot write " + path(rank_));
    }
  }
  std::vector<std::string> values(world_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  for (int r = 0; r < world_; ++r) {
    for (;;) {
      std::ifstream in(path(r), std::ios::binary);
      if (in) {
        std::stringstream buffer;
        buffer << in.rdbuf();
        values[r] = buffer.str();
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return DeadlineExceeded("rendezvous: rank " + std::to_string(r) + " did not publish \"" +
                                key + "\" within " + std::to_string(timeout_ms_) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  return values;
}

}  // namespace gcmoe::tools
