// The file rendezvous of `gcmoe bench ep`'s rank processes: every rank's value in rank order,
// repeated keys, and a clear deadline when a rank never publishes.
#include "tools/bench_rendezvous.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace gcmoe::tools {
namespace {

std::string FreshDirectory() {
  const std::string dir = ::testing::TempDir() + "gcmoe_rendezvous_" + std::to_string(getpid()) +
                          "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(FileRendezvous, EveryRankSeesEveryValueInRankOrder) {
  const std::string dir = FreshDirectory();
  constexpr int kWorld = 4;
  std::vector<std::vector<std::string>> seen(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      FileRendezvous meet(dir, r, kWorld, 10000);
      // Binary values (a unique id is 128 arbitrary bytes), and a key used twice in a row.
      for (const char* key : {"names", "go"}) {
        std::string value = std::string(key) + std::to_string(r);
        value.push_back('\0');
        value.push_back(static_cast<char>(0xFF));
        auto all = meet.AllGather(key, value);
        ASSERT_TRUE(all.ok()) << all.status().ToString();
        for (const std::string& v : *all) seen[r].push_back(v);
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(seen[r].size(), 2u * kWorld);
    for (int q = 0; q < kWorld; ++q) {
      EXPECT_EQ(seen[r][q], "names" + std::to_string(q) + std::string("\0\xFF", 2));
      EXPECT_EQ(seen[r][kWorld + q], "go" + std::to_string(q) + std::string("\0\xFF", 2));
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(FileRendezvous, AMissingRankIsADeadlineNamingIt) {
  const std::string dir = FreshDirectory();
  FileRendezvous meet(dir, 0, 2, 100);
  auto all = meet.AllGather("names-gcmoe", "x");
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(all.status().message().find("rank 1"), std::string::npos) << all.status().ToString();
  EXPECT_NE(all.status().message().find("names-gcmoe"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gcmoe::tools
