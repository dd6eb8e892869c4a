// A coordinator's rank I/O region left behind: a coordinator SIGKILLed before its rank mapped
// the region cannot remove it. The next coordinator's RankIo::Create removes regions of that
// name form whose owner is gone, and nothing else.
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

}  // namespace
}  // namespace gcmoe::server
