// `gcmoe bench serve` as a user runs it: it starts the embedded default service, measures every
// (T, callers, mode) row it was asked for over several connections, and writes them as JSON
// whose numbers hang together; bad flags are refused before anything starts.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

TEST(BenchServe, EveryRowOfEveryModeOverSeveralConnections) {
  const std::string json_path = TempPath("bench_serve.json");
  std::remove(json_path.c_str());
  auto bench = Process::Start({"bench", "serve", "--tokens-per-rank", "1,3", "--concurrency", "1,4",
                               "--connections", "2", "--modes", "unary,stream,registered",
                               "--requests", "24", "--warmup", "4", "--json", json_path},
                              TempPath("bench_serve.log"));
  const std::optional<int> status = bench->Wait(milliseconds(240000));
  ASSERT_TRUE(status.has_value()) << bench->Log();
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << bench->Log();

  std::ifstream file(json_path);
  ASSERT_TRUE(file.good()) << bench->Log();
  const nlohmann::json rows = nlohmann::json::parse(file);
  ASSERT_TRUE(rows.is_array());
  std::set<std::tuple<int, int, std::string>> seen;
  for (const nlohmann::json& r : rows) {
    SCOPED_TRACE(r.dump());
    const int per_rank = r.at("tokens_per_rank");
    seen.insert({per_rank, r.at("concurrency").get<int>(), r.at("mode").get<std::string>()});
    EXPECT_EQ(r.at("backend"), "cpu");
    EXPECT_EQ(r.at("ranks"), 2);
    EXPECT_EQ(r.at("tokens"), 2 * per_rank);  // the embedded default has two ranks
    EXPECT_EQ(r.at("connections"), 2);
    EXPECT_EQ(r.at("errors"), 0);
    EXPECT_TRUE(r.at("shared_memory_io").get<bool>());
    const double forward = r.at("forward_p50_us");
    const double engine = r.at("engine_p50_us");
    EXPECT_GT(r.at("echo_p50_us").get<double>(), 0.0);
    EXPECT_GT(engine, 0.0);
    // The engine runs inside the call, and the server's total inside what the client waits.
    EXPECT_LE(engine, forward);
    EXPECT_LE(r.at("stages").at("total_p50_us").get<double>(), forward);
    EXPECT_GE(r.at("forward_p99_us").get<double>(), forward);
    EXPECT_GE(r.at("batched_calls_mean").get<double>(), 1.0);
    EXPECT_GT(r.at("tokens_per_s").get<double>(), 0.0);
  }
  std::set<std::tuple<int, int, std::string>> expected;
  for (int t : {1, 3}) {
    for (int c : {1, 4}) {
      for (const char* mode : {"unary", "stream", "registered"}) expected.insert({t, c, mode});
    }
  }
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(rows.size(), expected.size());
}

// A benchmark whose calls failed measured something else: its rows are marked and it fails.
// With server.max_queue 1, while one call's step runs and one call waits, the service refuses
// the others (RESOURCE_EXHAUSTED), and the first call to find the queue empty always runs.
TEST(BenchServe, ARowWithFailedCallsIsMarkedAndTheRunFails) {
  const std::string json_path = TempPath("bench_serve_failed.json");
  std::remove(json_path.c_str());
  constexpr int kRequests = 80;
  auto bench = Process::Start(
      {"bench", "serve", "--tokens-per-rank", "4", "--concurrency", "8", "--connections", "2",
       "--modes", "unary", "--requests", std::to_string(kRequests), "--warmup", "0", "--set",
       "server.max_queue=1", "--json", json_path},
      TempPath("bench_serve_failed.log"));
  const std::optional<int> status = bench->Wait(milliseconds(240000));
  ASSERT_TRUE(status.has_value()) << bench->Log();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << bench->Log();
  const std::string log = bench->Log();
  EXPECT_NE(log.find("calls failed"), std::string::npos) << log;  // the row's mark
  EXPECT_NE(log.find("RESOURCE_EXHAUSTED"), std::string::npos) << log;
  EXPECT_NE(log.find("not a measurement of the service"), std::string::npos) << log;

  std::ifstream file(json_path);
  ASSERT_TRUE(file.good()) << log;
  const nlohmann::json rows = nlohmann::json::parse(file);
  ASSERT_EQ(rows.size(), 1u) << rows.dump();
  const int errors = rows[0].at("errors");
  EXPECT_GT(errors, 0);
  EXPECT_LT(errors, kRequests);
}

TEST(BenchServe, BadFlagsAreRefusedBeforeAServiceStarts) {
  int run = 0;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"bench", "serve", "--connections", "0"},
        std::vector<std::string>{"bench", "serve", "--concurrency", "two"}}) {
    auto bench = Process::Start(args, TempPath("bench_serve_bad" + std::to_string(run++) + ".log"));
    const std::optional<int> status = bench->Wait(milliseconds(30000));
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << bench->Log();
    EXPECT_EQ(bench->Log().find("starting gcmoe serve"), std::string::npos) << bench->Log();
  }
}

}  // namespace
}  // namespace gcmoe::server::testing
