// NCCL as the CUDA backend loads it at run time: the per-epoch unique id the coordinator hands
// out (made without a GPU, as on a coordinator host) and the errors of a communicator that
// cannot be joined. Joining real communicators is covered on GPUs (kernels_multi_gpu_test).
#include <gtest/gtest.h>

#include "engine/nccl_comm.h"

namespace gcmoe::engine {
namespace {

TEST(NcclLibrary, LoadsAndNamesItsVersion) {
  const std::string version = NcclVersionText();
  EXPECT_EQ(version.rfind("NCCL 2.", 0), 0u) << version;
}

TEST(NcclUniqueId, IsFreshEveryEpoch) {
  auto a = NewNcclUniqueId();
  auto b = NewNcclUniqueId();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->size(), kNcclUniqueIdBytes);
  EXPECT_EQ(b->size(), kNcclUniqueIdBytes);
  EXPECT_NE(*a, *b) << "two epochs must not share a bootstrap root";
}

TEST(NcclComm, WithoutAUniqueIdTheErrorSaysWhereItComesFrom) {
  for (const std::string& id : {std::string(), std::string(17, 'x')}) {
    auto comm = NcclComm::Init(id, 2, 0, 0);
    ASSERT_FALSE(comm.ok());
    EXPECT_EQ(comm.status().code(), StatusCode::kFailedPrecondition) << comm.status().ToString();
    EXPECT_NE(comm.status().message().find("engine.exchange"), std::string::npos)
        << comm.status().ToString();
  }
}

}  // namespace
}  // namespace gcmoe::engine
