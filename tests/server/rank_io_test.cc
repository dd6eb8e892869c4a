// The rank I/O region: its doorbell delivers every message once and in order, with as many
// unread as its ring holds (two steps in flight); and a region left behind by a coordinator
// SIGKILLed before its rank mapped it is removed by the next coordinator's RankIo::Create, with
// nothing else of that name form.
#include "server/rank_io.h"

#include <sys/mman.h>

#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "common/shared_memory.h"
#include "tests/common/stale_segments.h"

namespace gcmoe::server {
namespace {

using gcmoe::testing::SegmentExists;

// Every wait spins a little first, as the service's do with server.spin_wait on.
constexpr std::chrono::microseconds kSpin{200};

// Creates `name` in a process that is SIGKILLed, then dates the segment a minute back.
void LeaveBehind(const std::string& name) {
  gcmoe::testing::LeaveSegmentOfKilledProcess(name, 4096);
  gcmoe::testing::AgeSegment(name, std::chrono::seconds(60));
}

TEST(RankIoTest, CreateRemovesRegionsOfDeadCoordinatorsOnly) {
  // Named as Create names regions, and two names of other forms.
  const std::string stale = RandomSharedMemoryName(std::string(RankIo::kNamePrefix) + "-r3");
  const std::string short_name = stale.substr(0, stale.size() - 1);
  const std::string other = RandomSharedMemoryName("gcmoe_io_test");
  LeaveBehind(stale);
  LeaveBehind(short_name);
  LeaveBehind(other);

  Result<std::unique_ptr<RankIo>> io =
      RankIo::Create(0, RankIoLayout::For(4, 64, 2, RankIo::kSlots));
  ASSERT_TRUE(io.ok()) << io.status().ToString();
  EXPECT_FALSE(SegmentExists(stale));
  EXPECT_TRUE(SegmentExists(short_name));
  EXPECT_TRUE(SegmentExists(other));
  EXPECT_TRUE(SegmentExists((*io)->name())) << "its own region is live";
  shm_unlink(short_name.c_str());
  shm_unlink(other.c_str());
}

TEST(RankIoTest, DoorbellDeliversEveryMessageOnceInOrder) {
  Result<std::unique_ptr<RankIo>> io =
      RankIo::Create(0, RankIoLayout::For(4, 64, 2, RankIo::kSlots));
  ASSERT_TRUE(io.ok()) << io.status().ToString();
  RankIo& region = **io;
  uint32_t seen = region.sequence(RankIo::kToRank);
  std::string message;
  EXPECT_FALSE(region.Wait(RankIo::kToRank, &seen, kSpin, std::chrono::milliseconds(1), &message));

  // Two steps posted before the rank reads either (the pipeline's depth), of different sizes.
  static_assert(RankIoLayout::kMessageRing == 2);
  const std::string step1(100, 'a');
  const std::string step2(7, 'b');
  ASSERT_TRUE(region.Post(RankIo::kToRank, step1));
  ASSERT_TRUE(region.Post(RankIo::kToRank, step2));
  ASSERT_TRUE(region.Wait(RankIo::kToRank, &seen, kSpin, std::chrono::milliseconds(100), &message));
  EXPECT_EQ(message, step1);
  ASSERT_TRUE(region.Wait(RankIo::kToRank, &seen, kSpin, std::chrono::milliseconds(100), &message));
  EXPECT_EQ(message, step2);
  EXPECT_FALSE(region.Wait(RankIo::kToRank, &seen, kSpin, std::chrono::milliseconds(1), &message));
  // The other direction is independent of this one.
  uint32_t results_seen = region.sequence(RankIo::kToCoordinator);
  EXPECT_EQ(results_seen, 0u);
  EXPECT_FALSE(region.Wait(RankIo::kToCoordinator, &results_seen, kSpin,
                           std::chrono::milliseconds(1), &message));

  // Around the ring many times, one or two messages ahead of the reader.
  for (int i = 0; i < 9; ++i) {
    const std::string a = "step " + std::to_string(2 * i);
    const std::string b = "step " + std::to_string(2 * i + 1);
    ASSERT_TRUE(region.Post(RankIo::kToRank, a));
    ASSERT_TRUE(
        region.Wait(RankIo::kToRank, &seen, kSpin, std::chrono::milliseconds(100), &message));
    EXPECT_EQ(message, a);
    ASSERT_TRUE(region.Post(RankIo::kToRank, b));
    ASSERT_TRUE(
        region.Wait(RankIo::kToRank, &seen, kSpin, std::chrono::milliseconds(100), &message));
    EXPECT_EQ(message, b);
  }

  // A message larger than an area is refused (the caller sends it on the control stream).
  EXPECT_FALSE(region.Post(RankIo::kToRank, std::string(RankIoLayout::kMessageBytes + 1, 'c')));
  EXPECT_FALSE(region.Wait(RankIo::kToRank, &seen, kSpin, std::chrono::milliseconds(1), &message));
}

TEST(RankIoTest, AReaderBehindByMoreThanTheRingGetsTheNewestMessages) {
  Result<std::unique_ptr<RankIo>> io =
      RankIo::Create(0, RankIoLayout::For(4, 64, 2, RankIo::kSlots));
  ASSERT_TRUE(io.ok()) << io.status().ToString();
  uint32_t seen = 0;
  std::string message;
  for (const char* m : {"one", "two", "three"}) ASSERT_TRUE((*io)->Post(RankIo::kToCoordinator, m));
  ASSERT_TRUE(
      (*io)->Wait(RankIo::kToCoordinator, &seen, kSpin, std::chrono::milliseconds(100), &message));
  EXPECT_EQ(message, "two");
  ASSERT_TRUE(
      (*io)->Wait(RankIo::kToCoordinator, &seen, kSpin, std::chrono::milliseconds(100), &message));
  EXPECT_EQ(message, "three");
  EXPECT_EQ(seen, 3u);
}

}  // namespace
}  // namespace gcmoe::server
