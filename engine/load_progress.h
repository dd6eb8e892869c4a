// Progress of a long weight load: one log line per layer (bytes read, elapsed, what the layer
// reported) and, when stderr is a terminal, a progress bar redrawn in place.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace gcmoe::engine {

class LoadProgress {
 public:
  // `what` names the load ("hf:/models/gpt-oss-120b"); `total_bytes` is what it will read.
  LoadProgress(std::string what, int total_layers, uint64_t total_bytes);
  ~LoadProgress();

  // Layer `index` (0-based, of total_layers) is done after reading `bytes`; `detail` is added
  // to its log line ("model layer 5, calc_diff 2.1e-03").
  void LayerDone(int index, uint64_t bytes, const std::string& detail);

 private:
  void DrawBar() const;

  std::string what_;
  int total_layers_;
  uint64_t total_bytes_;
  uint64_t done_bytes_ = 0;
  int done_layers_ = 0;
  bool bar_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace gcmoe::engine
