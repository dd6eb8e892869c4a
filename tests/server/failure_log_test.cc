// The failure log on its own, on a clock the test drives: a burst logs its first lines whole and
// one summary with counts by code per interval; quiet intervals log nothing.
#include "server/failure_log.h"

#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace gcmoe::server {
namespace {

using Clock = FailureLog::Clock;
using std::chrono::milliseconds;

// The sink runs on the summary thread too: guarded.
struct Captured {
  std::mutex mu;
  std::vector<std::pair<spdlog::level::level_enum, std::string>> lines;
  FailureLog::Sink Sink() {
    return [this](spdlog::level::level_enum level, const std::string& line) {
      std::lock_guard<std::mutex> lock(mu);
      lines.emplace_back(level, line);
    };
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return lines.size();
  }
};

FailureLog::Options Options(int lines) {
  FailureLog::Options options;
  options.interval = milliseconds(1000);
  options.lines_per_interval = lines;
  options.summary_thread = false;
  return options;
}

TEST(FailureLogTest, ABurstKeepsItsFirstLinesAndSummarizesTheRestByCode) {
  Captured captured;
  FailureLog log(Options(3), captured.Sink());
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < 100; ++i) {
    const StatusCode code = i % 4 == 0 ? StatusCode::kDeadlineExceeded : StatusCode::kUnavailable;
    log.Record(code, spdlog::level::warn, "call " + std::to_string(i), t0 + milliseconds(i));
  }
  ASSERT_EQ(captured.lines.size(), 3u);
  EXPECT_EQ(captured.lines[0].second, "call 0");
  EXPECT_EQ(captured.lines[2].second, "call 2");
  log.Flush(t0 + milliseconds(999));
  EXPECT_EQ(captured.lines.size(), 3u) << "the interval has not ended";
  log.Flush(t0 + milliseconds(1000));
  ASSERT_EQ(captured.lines.size(), 4u);
  // Calls 3..99 were suppressed: 24 of them had i % 4 == 0.
  EXPECT_EQ(captured.lines[3].first, spdlog::level::warn);
  EXPECT_EQ(captured.lines[3].second,
            "97 more failed call(s) in 1.0 s not logged one by one: UNAVAILABLE 73, "
            "DEADLINE_EXCEEDED 24");
  log.Flush(t0 + milliseconds(5000));
  EXPECT_EQ(captured.lines.size(), 4u) << "one summary per interval";
}

TEST(FailureLogTest, ANewIntervalLogsWholeLinesAgain) {
  Captured captured;
  FailureLog log(Options(2), captured.Sink());
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < 5; ++i) log.Record(StatusCode::kUnavailable, spdlog::level::warn, "a", t0);
  // The next failure after the interval writes the pending summary first, then its own line.
  log.Record(StatusCode::kInternal, spdlog::level::err, "b", t0 + milliseconds(1500));
  ASSERT_EQ(captured.lines.size(), 4u);
  EXPECT_EQ(captured.lines[2].second,
            "3 more failed call(s) in 1.0 s not logged one by one: UNAVAILABLE 3");
  EXPECT_EQ(captured.lines[3].second, "b");
  EXPECT_EQ(captured.lines[3].first, spdlog::level::err);
}

TEST(FailureLogTest, ZeroLinesPerIntervalLogsSummariesOnly) {
  Captured captured;
  FailureLog log(Options(0), captured.Sink());
  const Clock::time_point t0 = Clock::now();
  log.Record(StatusCode::kInvalidArgument, spdlog::level::debug, "x", t0);
  log.Record(StatusCode::kInvalidArgument, spdlog::level::debug, "y", t0);
  EXPECT_TRUE(captured.lines.empty());
  log.Flush(t0 + milliseconds(1000));
  ASSERT_EQ(captured.lines.size(), 1u);
  EXPECT_EQ(captured.lines[0].second,
            "2 more failed call(s) in 1.0 s not logged one by one: INVALID_ARGUMENT 2");
}

TEST(FailureLogTest, TheSummaryThreadWritesAPendingSummaryWithoutFurtherFailures) {
  Captured captured;
  FailureLog::Options options;
  options.interval = milliseconds(100);
  options.lines_per_interval = 1;
  {
    FailureLog log(options, captured.Sink());
    log.Record(StatusCode::kUnavailable, spdlog::level::warn, "first");
    log.Record(StatusCode::kUnavailable, spdlog::level::warn, "second");
    // The summary comes from the thread once the interval ends; wait well past it.
    const auto deadline = Clock::now() + milliseconds(5000);
    while (Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(10));
      if (captured.size() >= 2) break;
    }
  }
  ASSERT_EQ(captured.lines.size(), 2u);
  EXPECT_EQ(captured.lines[1].second,
            "1 more failed call(s) in 0.1 s not logged one by one: UNAVAILABLE 1");
}

}  // namespace
}  // namespace gcmoe::server
