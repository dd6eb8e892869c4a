#include "server/failure_log.h"

#include <cstdio>

#include <spdlog/spdlog.h>

namespace gcmoe::server {

FailureLog::FailureLog(const Options& options, Sink sink)
    : options_(options), sink_(std::move(sink)) {
  if (options_.summary_thread) thread_ = std::thread([this] { SummaryLoop(); });
}

FailureLog::~FailureLog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    FlushLocked(Clock::now(), /*force=*/true);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void FailureLog::Record(StatusCode code, spdlog::level::level_enum level, const std::string& line,
                        Clock::time_point now) {
  std::unique_lock<std::mutex> lock(mu_);
  FlushLocked(now, /*force=*/false);
  if (!window_open_) {
    window_open_ = true;
    window_start_ = now;
    logged_in_window_ = 0;
  }
  if (logged_in_window_ < options_.lines_per_interval) {
    ++logged_in_window_;
    if (sink_) {
      sink_(level, line);
    } else {
      spdlog::log(level, "{}", line);
    }
    return;
  }
  const bool first_suppressed = suppressed_.empty();
  ++suppressed_[code];
  if (first_suppressed) {
    lock.unlock();
    cv_.notify_all();  // the summary thread now has an interval end to wait for
  }
}

void FailureLog::Flush(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  FlushLocked(now, /*force=*/false);
}

void FailureLog::FlushLocked(Clock::time_point now, bool force) {
  if (!window_open_ || (!force && now < window_start_ + options_.interval)) return;
  window_open_ = false;
  if (suppressed_.empty()) return;
  int64_t total = 0;
  std::string counts;
  for (const auto& [code, n] : suppressed_) {
    total += n;
    counts +=
        (counts.empty() ? "" : ", ") + std::string(StatusCodeName(code)) + " " + std::to_string(n);
  }
  suppressed_.clear();
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f",
                std::chrono::duration<double>(options_.interval).count());
  const std::string line = std::to_string(total) + " more failed call(s) in " + seconds +
                           " s not logged one by one: " + counts;
  if (sink_) {
    sink_(spdlog::level::warn, line);
  } else {
    spdlog::warn("{}", line);
  }
}

void FailureLog::SummaryLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (window_open_ && !suppressed_.empty()) {
      const Clock::time_point end = window_start_ + options_.interval;
      cv_.wait_until(lock, end, [&] { return stop_ || Clock::now() >= end; });
      if (stop_) break;
      FlushLocked(Clock::now(), /*force=*/false);
    } else {
      cv_.wait(lock, [&] { return stop_ || (window_open_ && !suppressed_.empty()); });
    }
  }
}

}  // namespace gcmoe::server
