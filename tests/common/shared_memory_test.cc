// Shared-memory segments left by owners that died: a child process creates a segment and is
// SIGKILLed (so nothing of its own runs to unlink it); the sweep must remove exactly those
// segments, and never a live owner's, a fresh one's, or one of another name.
#include "common/shared_memory.h"

#include <sys/mman.h>

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/common/stale_segments.h"

namespace gcmoe {
namespace {

using std::chrono::seconds;
using testing::AgeSegment;
using testing::LeaveSegmentOfKilledProcess;
using testing::SegmentExists;

class SweepTest : public ::testing::Test {
 protected:
  void SetUp() override { base_ = RandomSharedMemoryName("gcmoe_sweep_test").substr(1); }
  void TearDown() override {
    for (const std::string& name : made_) shm_unlink(name.c_str());
  }
  std::string Name(const std::string& what) {
    made_.push_back("/" + base_ + "-" + what);
    return made_.back();
  }
  // Only this test's names: other tests (and services) may run beside it.
  bool Ours(std::string_view name) const { return name.substr(0, base_.size()) == base_; }
  std::set<std::string> Sweep(seconds min_age) {
    std::set<std::string> removed;
    for (const StaleSegment& s :
         SweepStaleSharedMemory([this](std::string_view name) { return Ours(name); }, min_age)) {
      removed.insert(s.name);
    }
    return removed;
  }

  std::string base_;
  std::vector<std::string> made_;
};

TEST_F(SweepTest, RemovesOnlySegmentsWhoseOwnerDied) {
  const std::string dead = Name("dead");
  const std::string fresh = Name("fresh");
  const std::string live = Name("live");
  LeaveSegmentOfKilledProcess(dead, 1 << 20);
  LeaveSegmentOfKilledProcess(fresh, 4096);
  ASSERT_TRUE(SegmentExists(dead));  // the kill left it behind
  AgeSegment(dead, seconds(60));
  Result<std::unique_ptr<SharedMemory>> owned = SharedMemory::Create(live, 4096);
  ASSERT_TRUE(owned.ok()) << owned.status().ToString();
  AgeSegment(live, seconds(60));

  std::vector<StaleSegment> removed =
      SweepStaleSharedMemory([this](std::string_view name) { return Ours(name); }, seconds(10));
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0].name, dead);
  EXPECT_EQ(removed[0].bytes, size_t{1} << 20);
  EXPECT_FALSE(SegmentExists(dead));
  EXPECT_TRUE(SegmentExists(fresh)) << "a segment younger than min_age may be just being created";
  EXPECT_TRUE(SegmentExists(live)) << "its owner holds the lock";

  // Once old enough the fresh one goes too; the live one stays while its owner lives, and its
  // owner still removes it itself.
  EXPECT_EQ(Sweep(seconds(0)), std::set<std::string>{fresh});
  EXPECT_TRUE(SegmentExists(live));
  owned->reset();
  EXPECT_FALSE(SegmentExists(live));
}

TEST_F(SweepTest, LeavesOtherNamesAlone) {
  const std::string dead = Name("dead");
  LeaveSegmentOfKilledProcess(dead, 4096);
  EXPECT_TRUE(SweepStaleSharedMemory([](std::string_view) { return false; }, seconds(0)).empty());
  EXPECT_TRUE(SegmentExists(dead));
  EXPECT_EQ(Sweep(seconds(0)), std::set<std::string>{dead});
}

TEST_F(SweepTest, OpeningDoesNotTakeTheOwnersPlace) {
  // A peer that maps the segment holds no lock: once the owner dies the segment is stale even
  // while the peer still has it mapped.
  const std::string name = Name("peer");
  LeaveSegmentOfKilledProcess(name, 8192);
  Result<std::unique_ptr<SharedMemory>> peer = SharedMemory::Open(name, 8192);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  EXPECT_EQ((*peer)->data()[0], 1);
  EXPECT_EQ(Sweep(seconds(0)), std::set<std::string>{name});
  EXPECT_EQ((*peer)->data()[0], 1) << "the mapping outlives the name";
}

}  // namespace
}  // namespace gcmoe
