// A rank process that dies or hangs: health turns NOT_SERVING and Forward fails with
// UNAVAILABLE within 2 s, nothing hangs, and the service serves again once the rank is back.
// Also: a weights file the ranks cannot load stops `gcmoe serve` with a message naming the tensor,
// and a service killed whole leaves no shared memory behind once the next one starts.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "engine/weights.h"
#include "tests/common/stale_segments.h"
#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

using Clock = std::chrono::steady_clock;

grpc::Status CallForward(const std::string& address, int tokens, uint64_t seed,
                         gcmoe::v1::ForwardResponse* response,
                         milliseconds deadline = milliseconds(30000)) {
  RequestSpec r;
  r.num_tokens = tokens;
  r.seed = seed;
  auto stub = Connect(address);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  return stub->Forward(&context, MakeForwardRequest(DefaultModel(), r), response);
}

TEST(RankFailureTest, KilledRankMakesServiceUnavailableFastThenItServesAgain) {
  SeparateProcesses service("kill");
  ASSERT_FALSE(service.address().empty());
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(60000))) << service.Logs();
  gcmoe::v1::ForwardResponse before;
  ASSERT_TRUE(CallForward(service.address(), 64, 5, &before).ok());

  service.rank(1).Signal(SIGKILL);
  ASSERT_TRUE(service.rank(1).Wait(milliseconds(5000)).has_value());
  const auto killed = Clock::now();
  EXPECT_TRUE(WaitForHealth(service.address(), "NOT_SERVING", milliseconds(2000)))
      << service.Logs();
  gcmoe::v1::ForwardResponse response;
  const grpc::Status status = CallForward(service.address(), 64, 5, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_LT(Clock::now() - killed, milliseconds(2000));

  service.StartRank(1);
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(30000))) << service.Logs();
  gcmoe::v1::ForwardResponse after;
  const grpc::Status again = CallForward(service.address(), 64, 5, &after);
  ASSERT_TRUE(again.ok()) << again.error_message();
  EXPECT_EQ(after.output().data(), before.output().data());
}

TEST(RankFailureTest, RankDyingDuringAStepFailsThatStepWithinTwoSeconds) {
  // Long exchange timeout: only the death itself may end the step.
  SeparateProcesses service("inflight", {"--set", "engine.exchange_timeout_ms=60000"});
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(60000))) << service.Logs();
  // Freeze rank 1 so the step is certainly in flight when it dies.
  service.rank(1).Signal(SIGSTOP);
  auto call = std::async(std::launch::async, [&] {
    gcmoe::v1::ForwardResponse response;
    return CallForward(service.address(), 256, 9, &response);
  });
  EXPECT_EQ(call.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  service.rank(1).Signal(SIGKILL);
  const auto killed = Clock::now();
  ASSERT_EQ(call.wait_for(std::chrono::seconds(2)), std::future_status::ready)
      << "Forward still pending 2 s after the rank died\n" << service.Logs();
  const grpc::Status status = call.get();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_LT(Clock::now() - killed, milliseconds(2000));
  EXPECT_NE(status.error_message().find("rank 1"), std::string::npos) << status.error_message();

  // The survivor left the aborted step; with rank 1 back the service is whole again. It was
  // never cut off: its deadline (exchange timeout + 2 s) is a minute away.
  service.StartRank(1);
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(30000))) << service.Logs();
  gcmoe::v1::ForwardResponse response;
  EXPECT_TRUE(CallForward(service.address(), 256, 9, &response).ok()) << service.Logs();
  EXPECT_EQ(service.coordinator().Log().find("did not leave aborted step"), std::string::npos)
      << service.Logs();
}

TEST(RankFailureTest, RankDyingUnderMergedAndStreamedCallsFailsEachWithUnavailable) {
  // Calls wait 100 ms to share a step; rank 1 is frozen, so the shared step is in flight when
  // it dies, with a streamed call beside the unary ones.
  SeparateProcesses service("merged", {"--set", "engine.exchange_timeout_ms=60000", "--set",
                                       "server.batch_window_us=100000"});
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(60000))) << service.Logs();
  service.rank(1).Signal(SIGSTOP);
  std::vector<std::future<grpc::Status>> unary;
  for (int i = 0; i < 4; ++i) {
    unary.push_back(std::async(std::launch::async, [&, i] {
      gcmoe::v1::ForwardResponse response;
      const grpc::Status status = CallForward(service.address(), 7 + i, 20 + i, &response);
      EXPECT_TRUE(status.ok() || response.output().data().empty()) << "bytes with an error";
      return status;
    }));
  }
  auto streamed = std::async(std::launch::async, [&] {
    auto stub = Connect(service.address());
    grpc::ClientContext context;
    auto stream = stub->ForwardStream(&context);
    RequestSpec r;
    r.num_tokens = 5;
    gcmoe::v1::ForwardStreamResponse reply;
    const bool ok = stream->Write(MakeForwardRequest(DefaultModel(), r)) && stream->Read(&reply);
    stream->WritesDone();
    stream->Finish();
    EXPECT_TRUE(ok) << "the stream broke instead of answering";
    EXPECT_FALSE(reply.has_response() && reply.code() != 0);
    return reply.code();
  });
  std::this_thread::sleep_for(milliseconds(400));
  service.rank(1).Signal(SIGKILL);
  for (auto& call : unary) {
    ASSERT_EQ(call.wait_for(std::chrono::seconds(5)), std::future_status::ready) << service.Logs();
    const grpc::Status status = call.get();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  }
  ASSERT_EQ(streamed.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(streamed.get(), static_cast<int>(grpc::StatusCode::UNAVAILABLE));

  service.StartRank(1);
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(30000))) << service.Logs();
  gcmoe::v1::ForwardResponse response;
  EXPECT_TRUE(CallForward(service.address(), 9, 3, &response).ok()) << service.Logs();
  // The survivor is never cut off: its deadline (exchange timeout + 2 s) is a minute away.
  EXPECT_EQ(service.coordinator().Log().find("did not leave aborted step"), std::string::npos)
      << service.Logs();
}

TEST(RankFailureTest, RankDyingWithTwoStepsInFlightFailsBothAndEveryQueuedCall) {
  // One call per step: with rank 1 frozen, the first step waits at the ranks, the second is
  // sent behind it (server.max_steps_in_flight 2), and the other calls queue.
  SeparateProcesses service("pipelined", {"--set", "engine.exchange_timeout_ms=60000", "--set",
                                          "server.max_batch_calls=1"});
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(60000))) << service.Logs();
  gcmoe::v1::ForwardResponse expected;
  ASSERT_TRUE(CallForward(service.address(), 11, 40, &expected).ok()) << service.Logs();
  service.rank(1).Signal(SIGSTOP);
  std::vector<std::future<grpc::Status>> calls;
  for (int i = 0; i < 4; ++i) {
    calls.push_back(std::async(std::launch::async, [&, i] {
      gcmoe::v1::ForwardResponse response;
      const grpc::Status status = CallForward(service.address(), 11 + i, 40 + i, &response);
      EXPECT_TRUE(status.ok() || response.output().data().empty()) << "bytes with an error";
      return status;
    }));
    std::this_thread::sleep_for(milliseconds(50));  // in this order
  }
  std::this_thread::sleep_for(milliseconds(300));
  service.rank(1).Signal(SIGKILL);
  for (auto& call : calls) {
    ASSERT_EQ(call.wait_for(std::chrono::seconds(5)), std::future_status::ready) << service.Logs();
    const grpc::Status status = call.get();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  }
  // The second step was in flight beside the first and failed with it.
  EXPECT_NE(service.coordinator().Log().find("was abandoned with step"), std::string::npos)
      << service.Logs();

  // The survivor left both steps (the second aborted before it began); the new epoch serves
  // the same bytes as before.
  service.StartRank(1);
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(30000))) << service.Logs();
  gcmoe::v1::ForwardResponse after;
  ASSERT_TRUE(CallForward(service.address(), 11, 40, &after).ok()) << service.Logs();
  EXPECT_EQ(after.output().data(), expected.output().data());
  EXPECT_EQ(service.coordinator().Log().find("did not leave aborted step"), std::string::npos)
      << service.Logs();
}

TEST(RankFailureTest, HungRankIsCutOffAndRejoinsWhenItResumes) {
  SeparateProcesses service("hang", {"--set", "engine.exchange_timeout_ms=500"});
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(60000))) << service.Logs();
  service.rank(1).Signal(SIGSTOP);
  const auto stopped = Clock::now();
  gcmoe::v1::ForwardResponse response;
  const grpc::Status status = CallForward(service.address(), 32, 3, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_LT(Clock::now() - stopped, milliseconds(2000));
  EXPECT_EQ(HealthStatus(service.address()), "NOT_SERVING");

  service.rank(1).Signal(SIGCONT);
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(30000))) << service.Logs();
  EXPECT_TRUE(CallForward(service.address(), 32, 3, &response).ok()) << service.Logs();
}

TEST(RankFailureTest, ServeRestartsARankThatDies) {
  auto s = StartServe({"--set", "parallel.restart_backoff_ms=200"}, "restart",
                      milliseconds(60000));
  ASSERT_TRUE(s.has_value());
  const std::string log = s->process->Log();
  const std::optional<long> pid = NumberAfter(log, "started rank 1 (pid ");
  ASSERT_TRUE(pid.has_value()) << log;
  const pid_t rank1 = static_cast<pid_t>(*pid);
  kill(rank1, SIGKILL);
  EXPECT_TRUE(WaitForHealth(s->address, "NOT_SERVING", milliseconds(2000)));
  ASSERT_TRUE(WaitForHealth(s->address, "SERVING", milliseconds(30000))) << s->process->Log();
  gcmoe::v1::ForwardResponse response;
  EXPECT_TRUE(CallForward(s->address, 16, 1, &response).ok());
  auto stub = Connect(s->address);
  gcmoe::v1::Stats stats;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->GetStats(&context, {}, &stats).ok());
  ASSERT_EQ(stats.ranks_size(), 2);
  EXPECT_EQ(stats.ranks(1).restarts(), 1u);
  EXPECT_EQ(stats.ranks(0).restarts(), 0u);
}

// Every rank's exchange segment named in the coordinator's "attached (transport /gcmoe-...)"
// lines.
std::vector<std::string> AttachedSegments(const std::string& log) {
  const std::string marker = "attached (transport ";
  std::vector<std::string> names;
  for (size_t at = log.find(marker); at != std::string::npos; at = log.find(marker, at)) {
    at += marker.size();
    names.push_back(log.substr(at, log.find_first_of(",)", at) - at));
  }
  return names;
}

TEST(RankFailureTest, ServiceKilledWholeLeavesNoSharedMemoryForLong) {
  auto first = StartServe({}, "killed_whole", milliseconds(60000));
  ASSERT_TRUE(first.has_value());
  const std::string log = first->process->Log();
  const std::vector<std::string> segments = AttachedSegments(log);
  ASSERT_EQ(segments.size(), 2u) << log;
  // SIGKILL the ranks and serve at once: nothing of theirs runs to remove anything.
  for (const char* rank : {"started rank 0 (pid ", "started rank 1 (pid "}) {
    const std::optional<long> pid = NumberAfter(log, rank);
    ASSERT_TRUE(pid.has_value()) << log;
    kill(static_cast<pid_t>(*pid), SIGKILL);
  }
  first->process->Signal(SIGKILL);
  ASSERT_TRUE(first->process->Wait(milliseconds(10000)).has_value());
  for (const std::string& name : segments) {
    ASSERT_TRUE(gcmoe::testing::SegmentExists(name)) << name << " is gone: this test no longer kills anything";
    // As if the kill were a minute ago (a segment is swept only once it is 10 s old).
    gcmoe::testing::AgeSegment(name, std::chrono::seconds(60));
  }
  // The ranks of the dead service may take a moment to go: their locks go with them.
  std::this_thread::sleep_for(milliseconds(200));

  auto second = StartServe({}, "after_killed_whole", milliseconds(60000));
  ASSERT_TRUE(second.has_value());
  const std::string next_log = second->process->Log();
  // Gone. The next service's ranks remove them and log it, unless a service that other tests
  // start at the same moment got there first: so the log line is not required.
  for (const std::string& name : segments) EXPECT_FALSE(gcmoe::testing::SegmentExists(name)) << next_log;
  // Its own segments are live: they stay.
  for (const std::string& name : AttachedSegments(next_log)) EXPECT_TRUE(gcmoe::testing::SegmentExists(name));
  gcmoe::v1::ForwardResponse response;
  EXPECT_TRUE(CallForward(second->address, 16, 2, &response).ok());
}

// Synthetic weights with one NaN planted in layer 1, expert 3's w2.
class PoisonedWeights final : public engine::WeightSource {
 public:
  explicit PoisonedWeights(std::unique_ptr<engine::WeightSource> inner) : inner_(std::move(inner)) {}
  const engine::ModelSpec& spec() const override { return inner_->spec(); }
  std::string Describe() const override { return "poisoned"; }
  Result<engine::ExpertWeights> LoadExpert(int l, int e) const override {
    return inner_->LoadExpert(l, e);
  }
  Result<engine::SharedExpertWeights> LoadShared(int l) const override {
    return inner_->LoadShared(l);
  }
  Result<engine::DenseExpertWeights> LoadExpertDense(int l, int e) const override {
    auto w = inner_->LoadExpertDense(l, e);
    if (w.ok() && l == 1 && e == 3) w->w2[17] = std::numeric_limits<float>::quiet_NaN();
    return w;
  }
  Result<engine::DenseExpertWeights> LoadSharedDense(int l) const override {
    return inner_->LoadSharedDense(l);
  }
  Status CheckExperts(const std::vector<int>& layers, const std::vector<int>& experts) const override {
    return inner_->CheckExperts(layers, experts);
  }

 private:
  std::unique_ptr<engine::WeightSource> inner_;
};

TEST(RankFailureTest, WeightsWithNanStopServeWithTheTensorNamed) {
  auto synthetic = engine::WeightSource::Open(DefaultModel());
  ASSERT_TRUE(synthetic.ok());
  const PoisonedWeights poisoned(std::move(synthetic).value());
  const std::string path = TempPath("poisoned.safetensors");
  ASSERT_TRUE(engine::WriteWeightsFile(poisoned, engine::WeightFileForm::kFloat32, path).ok());

  const std::string log_path = TempPath("poisoned.log");
  auto serve = Process::Start({"serve", "--listen", "127.0.0.1:0", "--set",
                               "server.rank_listen=127.0.0.1:0", "--set",
                               "server.metrics_listen=127.0.0.1:0", "--set",
                               "model.weights=" + path},
                              log_path);
  const auto status = serve->Wait(milliseconds(60000));
  ASSERT_TRUE(status.has_value()) << "serve kept running with a poisoned weights file\n"
                                  << serve->Log();
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 1);
  EXPECT_NE(serve->Log().find("layers.1.experts.w2"), std::string::npos) << serve->Log();
}

}  // namespace
}  // namespace gcmoe::server::testing
