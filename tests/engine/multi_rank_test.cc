// The rank engine over the shared-memory exchange: the same request through 1, 2 and 4 ranks is
// bit-identical, matches the float64 references, and a step whose peers are missing fails
// promptly and cleanly instead of hanging.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "engine/numerics.h"
#include "engine/reference_layer.h"
#include "engine/weights.h"
#include "tests/engine/rank_world.h"
#include "tests/engine/tiny_model.h"

namespace gcmoe::engine::testing_util {
namespace {

// The embedded default's model: tiny-cpu.json (2 layers, synthetic:1).
ModelSpec TinyCpu() { return TinyModel("synthetic:1", /*layers=*/2); }

class MultiRankTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (int P : {1, 2, 4}) {
      WorldOptions options;
      options.world_size = P;
      options.capacity = 1024;
      options.threads = P == 2 ? 2 : 1;  // thread count must not change a bit either
      auto world = RankWorld::Create(TinyCpu(), options);
      ASSERT_TRUE(world.ok()) << world.status().ToString();
      worlds_[P] = std::move(world).value();
    }
  }
  static void TearDownTestSuite() {
    for (auto& w : worlds_) w.reset();
  }
  static std::unique_ptr<RankWorld> worlds_[5];
};
std::unique_ptr<RankWorld> MultiRankTest::worlds_[5];

TEST_F(MultiRankTest, SameRequestIsBitIdenticalThroughOneTwoAndFourRanks) {
  const ModelSpec spec = TinyCpu();
  int cases = 0;
  for (int T : {1, 2, 3, 5, 17, 64, 255, 1024}) {
    for (Routing routing : {Routing::kRandom, Routing::kUnusedSlots, Routing::kOneHotExpert}) {
      if (T == 1024 && routing == Routing::kRandom) continue;  // kept short; 1024 runs twice
      GlobalRequest request = MakeRequest(spec, T, routing, 1000 + T);
      request.layer = T % 2;
      auto one = worlds_[1]->Forward(request);
      ASSERT_TRUE(one.ok()) << one.status().ToString();
      ASSERT_EQ(one->size(), static_cast<size_t>(T) * spec.hidden * 4);
      for (int P : {2, 4}) {
        auto many = worlds_[P]->Forward(request);
        ASSERT_TRUE(many.ok()) << many.status().ToString();
        ASSERT_EQ(*many, *one) << "T=" << T << " P=" << P << " routing "
                               << static_cast<int>(routing);
      }
      ++cases;
    }
  }
  EXPECT_EQ(cases, 23);
}

TEST_F(MultiRankTest, MatchesTheFloat64References) {
  const ModelSpec spec = TinyCpu();
  auto weights = WeightSource::Open(spec);
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  for (DType dtype : {DType::kFP32, DType::kBF16, DType::kFP8E4M3}) {
    GlobalRequest request = MakeRequest(spec, 96, Routing::kUnusedSlots, 77);
    request.layer = 1;
    SetDType(&request, dtype);
    auto out = worlds_[2]->Forward(request);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    const std::vector<double> y = numerics::OutputToDoubles(*out, /*fp32=*/true);

    // The reference sees exactly the values the service saw.
    std::vector<float> hidden = request.hidden;
    if (dtype == DType::kBF16) {
      for (float& v : hidden) v = numerics::RoundToBF16(v);
    }
    ReferenceInput input;
    input.num_tokens = request.num_tokens;
    input.hidden = hidden.data();
    if (dtype == DType::kFP8E4M3) {
      input.hidden_fp8 = request.fp8.data();
      input.hidden_scales = request.scales.data();
    }
    input.topk_ids = request.ids.data();
    input.topk_weights = request.weights.data();
    auto quantized = ReferenceLayer(**weights, 1, input, ReferenceMode::kQuantizationAware);
    ASSERT_TRUE(quantized.ok()) << quantized.status().ToString();
    const double diff_q = numerics::CalcDiff(y.data(), quantized->data(), y.size());
    EXPECT_LT(diff_q, 1e-4) << "dtype " << static_cast<int>(dtype);

    auto exact = ReferenceLayer(**weights, 1, input, ReferenceMode::kUnquantized);
    ASSERT_TRUE(exact.ok()) << exact.status().ToString();
    const double diff_u = numerics::CalcDiff(y.data(), exact->data(), y.size());
    EXPECT_LT(diff_u, 0.02) << "dtype " << static_cast<int>(dtype);
    EXPECT_GE(numerics::Cosine(y.data(), exact->data(), y.size()), 0.97);
    for (double v : y) ASSERT_TRUE(std::isfinite(v));
  }
}

TEST_F(MultiRankTest, Bf16OutputIsTheRoundedFp32Output) {
  GlobalRequest request = MakeRequest(TinyCpu(), 33, Routing::kRandom, 5);
  auto fp32 = worlds_[4]->Forward(request);
  request.output_fp32 = false;
  auto bf16 = worlds_[4]->Forward(request);
  ASSERT_TRUE(fp32.ok() && bf16.ok());
  ASSERT_EQ(bf16->size() * 2, fp32->size());
  for (size_t i = 0; i < bf16->size() / 2; ++i) {
    float f;
    std::memcpy(&f, fp32->data() + 4 * i, 4);
    uint16_t b;
    std::memcpy(&b, bf16->data() + 2 * i, 2);
    ASSERT_EQ(b, numerics::FloatToBF16(f)) << "element " << i;
  }
}

TEST(MultiRankFailureTest, MissingPeerTimesOutNamingTheWait) {
  WorldOptions options;
  options.world_size = 2;
  options.capacity = 64;
  options.exchange_timeout_ms = 300;
  auto world = RankWorld::Create(TinyModel("synthetic:3"), options);
  ASSERT_TRUE(world.ok()) << world.status().ToString();
  const GlobalRequest request = MakeRequest(TinyModel(), 8, Routing::kRandom, 9);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Status> statuses = (*world)->StepSome(request, {0});
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(statuses.size(), 1u);
  EXPECT_EQ(statuses[0].code(), StatusCode::kUnavailable) << statuses[0].ToString();
  EXPECT_NE(statuses[0].message().find("rank 1's data-ready signal"), std::string::npos)
      << statuses[0].message();
  EXPECT_GE(waited, std::chrono::milliseconds(300));
  EXPECT_LT(waited, std::chrono::milliseconds(2000));

  // After a new epoch the pair serves again, and agrees with a single rank.
  ASSERT_TRUE((*world)->Reconnect().ok());
  auto pair = (*world)->Forward(request);
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  WorldOptions single = options;
  single.world_size = 1;
  auto alone = RankWorld::Create(TinyModel("synthetic:3"), single);
  ASSERT_TRUE(alone.ok());
  auto reference = (*alone)->Forward(request);
  ASSERT_TRUE(reference.ok());
  EXPECT_EQ(*pair, *reference);
}

TEST(MultiRankFailureTest, AbortReleasesAWaitingStepAtOnce) {
  WorldOptions options;
  options.world_size = 2;
  options.capacity = 64;
  options.exchange_timeout_ms = 60000;
  auto world = RankWorld::Create(TinyModel("synthetic:3"), options);
  ASSERT_TRUE(world.ok()) << world.status().ToString();
  const GlobalRequest request = MakeRequest(TinyModel(), 8, Routing::kRandom, 9);
  const uint64_t generation = (*world)->next_generation();
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    (*world)->engine(0).Abort(generation);
  });
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Status> statuses = (*world)->StepSome(request, {0});
  aborter.join();
  EXPECT_EQ(statuses[0].code(), StatusCode::kAborted) << statuses[0].ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));

  // An abort of an old generation does not touch the next step.
  ASSERT_TRUE((*world)->Reconnect().ok());
  (*world)->engine(0).Abort(generation);
  auto next = (*world)->Forward(request);
  EXPECT_TRUE(next.ok()) << next.status().ToString();
}

TEST(MultiRankFailureTest, ShardOverCapacityIsRefused) {
  WorldOptions options;
  options.world_size = 2;
  options.capacity = 4;
  auto world = RankWorld::Create(TinyModel("synthetic:3"), options);
  ASSERT_TRUE(world.ok());
  const GlobalRequest request = MakeRequest(TinyModel(), 9, Routing::kRandom, 1);  // 5 + 4
  auto out = (*world)->Forward(request);
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted) << out.status().ToString();
}

// Engine::Launch and Finish, the halves a rank pipelines steps with: the bytes of Step, steps
// finished in launch order only, and no Finish without a Launch.
TEST(EngineHalvesTest, LaunchAndFinishGiveStepsBytesInLaunchOrder) {
  WorldOptions options;
  options.capacity = 64;
  auto world = RankWorld::Create(TinyCpu(), options);
  ASSERT_TRUE(world.ok()) << world.status().ToString();
  Engine& engine = (*world)->engine(0);
  const ModelSpec spec = TinyCpu();
  const int E = spec.num_experts;
  GlobalRequest requests[2] = {MakeRequest(spec, 21, Routing::kRandom, 4),
                               MakeRequest(spec, 33, Routing::kUnusedSlots, 5)};
  std::vector<uint8_t> alone[2];
  for (int i = 0; i < 2; ++i) {
    auto out = (*world)->Forward(requests[i]);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    alone[i] = std::move(out).value();
  }
  std::vector<int> tokens[2];
  std::vector<int64_t> counts[2];
  StepRequest steps[2];
  uint64_t generation = (*world)->next_generation() + 10;
  for (int i = 0; i < 2; ++i) {
    const GlobalRequest& r = requests[i];
    tokens[i] = {r.num_tokens};
    counts[i].assign(E, 0);
    for (int32_t e : r.ids) {
      if (e >= 0) ++counts[i][e];
    }
    steps[i].generation = ++generation;
    steps[i].tokens_per_rank = tokens[i];
    steps[i].counts = counts[i];
    steps[i].hidden.dtype = DType::kFP32;
    steps[i].hidden.data = r.hidden.data();
    steps[i].topk_ids = r.ids.data();
    steps[i].topk_weights = r.weights.data();
    steps[i].output_fp32 = r.output_fp32;
  }
  StepOutput out[2];
  StepStats stats[2];
  EXPECT_EQ(engine.Finish(steps[0].generation, &out[0], &stats[0]).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(engine.Launch(steps[0], &out[0], &stats[0]).ok());
  ASSERT_TRUE(engine.Launch(steps[1], &out[1], &stats[1]).ok());
  EXPECT_EQ(engine.Finish(steps[1].generation, &out[1], &stats[1]).code(),
            StatusCode::kFailedPrecondition);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(engine.Done(steps[i].generation));  // the cpu backend runs a step in Launch
    ASSERT_TRUE(engine.Finish(steps[i].generation, &out[i], &stats[i]).ok()) << i;
    EXPECT_EQ(out[i].output, alone[i]) << i;
    EXPECT_GT(stats[i].engine_ns, 0) << i;
    EXPECT_EQ(stats[i].load_after.size(), 1u) << i;
  }
  EXPECT_FALSE(engine.pipelines());
}

}  // namespace
}  // namespace gcmoe::engine::testing_util
