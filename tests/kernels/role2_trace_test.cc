// The role2 trace summary (kernels/role2_trace.h) on a hand-made timeline whose numbers are
// worked out here: which tasks count, the spans, the slowest task and the busiest SM.
#include "kernels/role2_trace.h"

#include <vector>

#include <gtest/gtest.h>

namespace gcmoe::kernels {
namespace {

TaskTrace Task(uint32_t cta, uint32_t sm, uint32_t kind, uint64_t claim, uint64_t ready,
               uint64_t start, uint64_t done) {
  return TaskTrace{cta, sm, kind, 1, claim, ready, start, done};
}

TEST(Role2TraceTest, SummarizesWaitsRunsAndTheSlowestTask) {
  std::vector<TaskTrace> trace = {
      // Two routed W1 tasks: 10 us on SM 5, 50 us on SM 6 after a 2 us queue.
      Task(0, 5, kRoutedW1, 1000, 2000, 2000, 12000),
      Task(1, 6, kRoutedW1, 1000, 1500, 3500, 53500),
      // A routed W2 task that waited 47 us for its block's W1 tiles, then ran 10 us on SM 5.
      Task(0, 5, kRoutedW2, 13000, 60000, 60000, 70000),
      TaskTrace{},  // never reached (recorded == 0)
  };
  const std::string s = SummarizeRole2Trace(trace);
  SCOPED_TRACE(s);
  EXPECT_NE(s.find("3 tasks on 2 CTAs and 2 SMs, 69.0 us from the first claim"), std::string::npos);
  EXPECT_NE(s.find("1 tasks not recorded"), std::string::npos);
  EXPECT_NE(s.find("routed W1: 2 tasks, the last done at 52.5 us"), std::string::npos);
  EXPECT_NE(s.find("routed W2: 1 tasks, the last done at 69.0 us"), std::string::npos);
  EXPECT_NE(s.find("max     47.0 us"), std::string::npos);  // the W2 wait
  EXPECT_NE(
      s.find("slowest 1: task 1 (routed W1) on CTA 1, SM 6: ran 50.0 us, from 2.5 to 52.5 us"),
      std::string::npos);
  // CTA 0's last task ends at 69.0 us, CTA 1's at 52.5; 70 us of runs in 2 x 69 us.
  EXPECT_NE(s.find("CTAs' last task done: first 52.5, median 52.5, last 69.0 us; tasks ran 50.7 % "
                   "of the CTAs' time"),
            std::string::npos);
  EXPECT_NE(s.find("busiest SM 6: 1 tasks, 50.0 us"), std::string::npos);
  EXPECT_EQ(s.find("shared W1"), std::string::npos);  // no task of that kind
}

TEST(Role2TaskCountTest, CountsW1AndW2TilesOfEveryBlock) {
  // The GLM-5.2 layer (H 6144, I 2048): 64 W1 and 96 W2 tiles per block. The block and task
  // counts are the pairs the GPU's role2 trace reported on 2 x H200.
  LayerDims glm;
  glm.hidden = 6144;
  glm.intermediate = 2048;
  EXPECT_EQ(Role2TaskCount(glm, 3, 0), 480);
  EXPECT_EQ(Role2TaskCount(glm, 8, 0), 1280);
  EXPECT_EQ(Role2TaskCount(glm, 12, 0), 1920);
  EXPECT_EQ(Role2TaskCount(glm, 14, 0), 2240);
  EXPECT_EQ(Role2TaskCount(glm, 3, 5), 480);  // no shared expert: its blocks count nothing
  // With a shared expert (H 5120, I = I_s = 2304): 72 W1 + 80 W2 tiles per block of either.
  LayerDims shared;
  shared.hidden = 5120;
  shared.intermediate = 2304;
  shared.shared_intermediate = 2304;
  EXPECT_EQ(Role2TaskCount(shared, 2, 1), 3 * (72 + 80));
}

TEST(Role2TraceTest, SaysSoWhenNothingWasRecorded) {
  const std::vector<TaskTrace> trace(3);
  EXPECT_EQ(SummarizeRole2Trace(trace), "role2 trace: no task recorded (3 expected)\n");
}

}  // namespace
}  // namespace gcmoe::kernels
