// Relief in every step, through `gcmoe serve` on 4 ranks with skewed routing: the per-rank loads
// in ForwardStats are the ones the solver predicts on the same counts, the peak load drops
// against balancing off, and the outputs stay bit-identical to balancing off. Also the
// coordinator's refit from observed loads and its calibration of the pass count.
#include <algorithm>

#include <gtest/gtest.h>

#include "balancer/relief.h"
#include "server/balance_planner.h"
#include "server/command_config.h"
#include "server/engine_config.h"
#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

const std::vector<std::string> kRelief = {"--ranks", "4", "--set", "engine.threads=1", "--set",
                                          "balancer.enabled=true", "--set",
                                          "balancer.topology=ring", "--set",
                                          "balancer.passes=12"};

std::vector<std::string> With(std::vector<std::string> base, std::vector<std::string> more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

// The config the service runs, rebuilt from the same overrides.
config::Config ServiceConfig(const std::vector<std::string>& args) {
  std::vector<std::string> overrides = {"parallel.ranks=4"};
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--set") overrides.push_back(args[i + 1]);
  }
  auto config = LoadCommandConfig("", overrides);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return *config;
}

gcmoe::v1::ForwardRequest Skewed(int tokens, uint64_t seed) {
  RequestSpec r;
  r.num_tokens = tokens;
  r.layer = 1;
  r.hot_expert = 0;  // every token's first slot: the home of expert 0 is overloaded
  r.output_dtype = gcmoe::v1::BF16;
  r.seed = seed;
  return MakeForwardRequest(DefaultModel(), r);
}

std::vector<int64_t> ExpertTotals(const gcmoe::v1::ForwardRequest& request, int experts) {
  std::vector<int64_t> totals(experts, 0);
  const auto* ids = reinterpret_cast<const int32_t*>(request.topk_ids().data().data());
  const size_t n = request.topk_ids().data().size() / 4;
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] >= 0) ++totals[ids[i]];
  }
  return totals;
}

gcmoe::v1::ForwardResponse Call(const std::string& address,
                                const gcmoe::v1::ForwardRequest& request) {
  auto stub = Connect(address);
  gcmoe::v1::ForwardResponse response;
  grpc::ClientContext context;
  const grpc::Status status = stub->Forward(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response;
}

int64_t Max(const google::protobuf::RepeatedField<int64_t>& v) {
  return *std::max_element(v.begin(), v.end());
}

TEST(BalancerServiceTest, LoadsAreThePredictedOnesAndOutputsMatchBalancingOff) {
  auto relief = StartServe(kRelief, "relief", milliseconds(60000));
  auto off = StartServe({"--ranks", "4", "--set", "engine.threads=1"}, "relief_off",
                        milliseconds(60000));
  ASSERT_TRUE(relief.has_value() && off.has_value());

  // The solver the test trusts: a fresh Relief on the placement the config implies.
  const config::Config config = ServiceConfig(kRelief);
  auto placement = InitialPlacement(config);
  ASSERT_TRUE(placement.ok()) << placement.status().ToString();
  balancer::ReliefOptions options;
  options.fraction_bits = config.balancer.fractional_bits;
  options.passes = 12;
  auto solver = balancer::CreateReliefBalancer(options);
  ASSERT_TRUE(solver.ok());
  ASSERT_TRUE((*solver)->SetPlacement(*placement).ok());

  for (int T : {16, 64, 256}) {
    const gcmoe::v1::ForwardRequest request = Skewed(T, 40 + T);
    const gcmoe::v1::ForwardResponse balanced = Call(relief->address, request);
    const gcmoe::v1::ForwardResponse plain = Call(off->address, request);
    ASSERT_EQ(balanced.output().data(), plain.output().data()) << "T=" << T;

    balancer::Split split;
    ASSERT_TRUE((*solver)->Solve(ExpertTotals(request, config.model.experts), &split).ok());
    const auto& stats = balanced.stats();
    EXPECT_EQ(std::vector<int64_t>(stats.load_before().begin(), stats.load_before().end()),
              split.load_before) << "T=" << T;
    EXPECT_EQ(std::vector<int64_t>(stats.load_after().begin(), stats.load_after().end()),
              split.load_after) << "T=" << T;
    EXPECT_LT(Max(stats.load_after()), Max(stats.load_before())) << "T=" << T;
    EXPECT_EQ(stats.relief_passes(), 12u);
    EXPECT_TRUE(stats.balancer_enabled());
    // What each rank computed is what the split gave it.
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(stats.ranks(r).assignments_computed(), split.load_after[r]) << "rank " << r;
    }
    // Balancing off: every assignment at home.
    EXPECT_EQ(std::vector<int64_t>(plain.stats().load_after().begin(),
                                   plain.stats().load_after().end()),
              std::vector<int64_t>(plain.stats().load_before().begin(),
                                   plain.stats().load_before().end()));
    EXPECT_EQ(plain.stats().relief_passes(), 0u);
  }
  auto stub = Connect(relief->address);
  gcmoe::v1::Stats stats;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->GetStats(&context, {}, &stats).ok());
  EXPECT_GT(stats.spatial_utilization_after(), stats.spatial_utilization_before());
}

TEST(BalancerServiceTest, RefitFromObservedLoadsKeepsServingAndOutputs) {
  const auto args = With(kRelief, {"--set", "balancer.placement=observed", "--set",
                                   "balancer.refit_steps=3"});
  auto relief = StartServe(args, "refit", milliseconds(60000));
  auto off = StartServe({"--ranks", "4", "--set", "engine.threads=1"}, "refit_off",
                        milliseconds(60000));
  ASSERT_TRUE(relief.has_value() && off.has_value());
  std::vector<std::vector<int64_t>> before;
  for (int step = 0; step < 8; ++step) {
    const gcmoe::v1::ForwardRequest request = Skewed(64, 7);  // the same counts every step
    const gcmoe::v1::ForwardResponse balanced = Call(relief->address, request);
    ASSERT_EQ(balanced.output().data(), Call(off->address, request).output().data());
    before.emplace_back(balanced.stats().load_before().begin(),
                        balanced.stats().load_before().end());
  }
  // Steps 0-2 ran on the uniform fit; from step 3 on, on the placement fitted to them, which
  // no longer stacks the hot expert with others on one rank.
  EXPECT_EQ(before[0], before[2]);
  EXPECT_NE(before[2], before[3]);
  EXPECT_LT(*std::max_element(before[3].begin(), before[3].end()),
            *std::max_element(before[2].begin(), before[2].end()));
  EXPECT_NE(relief->process->Log().find("placement refitted"), std::string::npos);
}

TEST(BalancerServiceTest, AutoPassesAreCalibratedOnceAndSentToEveryRank) {
  auto relief = StartServe(With(kRelief, {"--set", "balancer.passes=\"auto\""}), "auto",
                           milliseconds(60000));
  ASSERT_TRUE(relief.has_value());
  uint32_t passes = 0;
  for (int step = 0; step < BalancePlanner::kCalibrationSteps + 2; ++step) {
    passes = Call(relief->address, Skewed(64, 100 + step)).stats().relief_passes();
    if (step < BalancePlanner::kCalibrationSteps) {
      EXPECT_EQ(passes, static_cast<uint32_t>(BalancePlanner::kCalibrationMaxPasses));
    }
  }
  const std::string log = relief->process->Log();
  const std::optional<long> calibrated = NumberAfter(log, "calibrated I* = ");
  ASSERT_TRUE(calibrated.has_value()) << log;
  EXPECT_EQ(passes, static_cast<uint32_t>(*calibrated));
  EXPECT_GE(passes, 1u);
}

}  // namespace
}  // namespace gcmoe::server::testing
