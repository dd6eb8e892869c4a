// Failed calls in the log without letting a flood of them flood it: in each interval the first
// failures_per_interval are logged one line each, the rest are counted by status code and told
// in one summary line when the interval ends (logging.failure_interval_ms,
// logging.failures_per_interval). A stalled rank fails thousands of calls a second; the log keeps
// a few of them whole and the count of the others.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include <spdlog/common.h>

#include "common/status.h"

namespace gcmoe::server {

class FailureLog {
 public:
  using Clock = std::chrono::steady_clock;
  // Where lines go: spdlog's default logger unless a test captures them.
  using Sink = std::function<void(spdlog::level::level_enum, const std::string&)>;

  struct Options {
    Clock::duration interval = std::chrono::seconds(1);
    int lines_per_interval = 10;
    // A thread that writes a pending summary when its interval ends even if no further failure
    // comes; off in tests, which drive the clock themselves through Flush.
    bool summary_thread = true;
  };

  explicit FailureLog(const Options& options, Sink sink = {});
  ~FailureLog();  // writes a pending summary, stops the thread
  FailureLog(const FailureLog&) = delete;
  FailureLog& operator=(const FailureLog&) = delete;

  // One failure: logs `line` at `level`, or counts it under `code` when this interval's lines
  // are spent.
  void Record(StatusCode code, spdlog::level::level_enum level, const std::string& line) {
    Record(code, level, line, Clock::now());
  }
  void Record(StatusCode code, spdlog::level::level_enum level, const std::string& line,
              Clock::time_point now);
  // Writes the summary of an interval that has ended by `now`, if it suppressed anything.
  void Flush(Clock::time_point now);

 private:
  void FlushLocked(Clock::time_point now, bool force);
  void SummaryLoop();

  const Options options_;
  const Sink sink_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool window_open_ = false;
  Clock::time_point window_start_{};
  int logged_in_window_ = 0;
  std::map<StatusCode, int64_t> suppressed_;  // by code, in the open window
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace gcmoe::server
