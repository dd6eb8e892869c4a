#include "engine/load_progress.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>

namespace gcmoe::engine {
namespace {

constexpr int kBarWidth = 40;

double MiB(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

LoadProgress::LoadProgress(std::string what, int total_layers, uint64_t total_bytes)
    : what_(std::move(what)),
      total_layers_(total_layers),
      total_bytes_(total_bytes),
      bar_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()) {
  spdlog::info("{}: loading {} layer(s), {:.1f} MiB to read", what_, total_layers_,
               MiB(total_bytes_));
}

LoadProgress::~LoadProgress() {
  if (bar_ && done_layers_ > 0) std::fputc('\n', stderr);
}

void LoadProgress::LayerDone(int index, uint64_t bytes, const std::string& detail) {
  done_bytes_ += bytes;
  ++done_layers_;
  const double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  // The bar shares stderr with the log: clear its line before the log writes over it.
  if (bar_) std::fputs("\r\033[K", stderr);
  spdlog::info("{}: layer {}/{} loaded ({}{}{:.1f} of {:.1f} MiB, {:.1f} s elapsed)", what_,
               index + 1, total_layers_, detail, detail.empty() ? "" : ", ", MiB(done_bytes_),
               MiB(total_bytes_), elapsed_s);
  if (bar_) DrawBar();
}

void LoadProgress::DrawBar() const {
  const double fraction =
      total_bytes_ == 0 ? 1.0
                        : static_cast<double>(done_bytes_) / static_cast<double>(total_bytes_);
  const int filled = static_cast<int>(fraction * kBarWidth + 0.5);
  std::string bar(filled, '#');
  bar.resize(kBarWidth, '.');
  std::fprintf(stderr, "\r[%s] %3d%%  layer %d/%d", bar.c_str(), static_cast<int>(fraction * 100),
               done_layers_, total_layers_);
  std::fflush(stderr);
}

}  // namespace gcmoe::engine
