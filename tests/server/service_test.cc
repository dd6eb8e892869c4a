// `gcmoe serve` as a user runs it, on loopback: Forward against the float64 references, the
// same request through 1, 2 and 4 ranks, the bad-request catalogue, health, reflection, stats,
// and a clean SIGTERM.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include <gtest/gtest.h>

#include "engine/numerics.h"
#include "engine/reference_layer.h"
#include "engine/weights.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/server/bad_requests.h"
#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

std::vector<double> Reference(const engine::WeightSource& weights,
                              const gcmoe::v1::ForwardRequest& request,
                              engine::ReferenceMode mode) {
  const std::vector<float> hidden = HiddenAsFloats(request);
  engine::ReferenceInput input;
  input.num_tokens = static_cast<int>(request.hidden().shape(0));
  input.hidden = hidden.data();
  if (request.hidden().dtype() == gcmoe::v1::FP8_E4M3) {
    input.hidden_fp8 = reinterpret_cast<const uint8_t*>(request.hidden().data().data());
    input.hidden_scales = reinterpret_cast<const uint8_t*>(request.hidden_scales().data().data());
  }
  input.topk_ids = reinterpret_cast<const int32_t*>(request.topk_ids().data().data());
  input.topk_weights = reinterpret_cast<const float*>(request.topk_weights().data().data());
  auto y = engine::ReferenceLayer(weights, static_cast<int>(request.layer()), input, mode);
  EXPECT_TRUE(y.ok()) << y.status().ToString();
  return y.ok() ? *y : std::vector<double>{};
}

class ServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    service_ = new std::optional<Service>(
        StartServe({"--set", "engine.threads=1"}, "service", milliseconds(60000)));
  }
  static void TearDownTestSuite() {
    delete service_;
    service_ = nullptr;
  }
  const Service& service() { return **service_; }
  static std::optional<Service>* service_;
};
std::optional<Service>* ServiceTest::service_ = nullptr;

TEST_F(ServiceTest, ForwardMatchesTheReferencesForEveryInputDtype) {
  ASSERT_TRUE(service_->has_value());
  const engine::ModelSpec spec = DefaultModel();
  auto weights = engine::WeightSource::Open(spec);
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  auto stub = Connect(service().address);
  int checked = 0;
  for (gcmoe::v1::DType dtype : {gcmoe::v1::FP32, gcmoe::v1::BF16, gcmoe::v1::FP8_E4M3}) {
    for (int T : {1, 7, 300}) {
      RequestSpec r;
      r.num_tokens = T;
      r.layer = T % 2;
      r.dtype = dtype;
      r.unused_every = 5;
      r.seed = 100 + T;
      const gcmoe::v1::ForwardRequest request = MakeForwardRequest(spec, r);
      gcmoe::v1::ForwardResponse response;
      grpc::ClientContext context;
      const grpc::Status status = stub->Forward(&context, request, &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      ASSERT_EQ(response.output().shape_size(), 2);
      EXPECT_EQ(response.output().shape(0), T);
      EXPECT_EQ(response.output().shape(1), spec.hidden);
      EXPECT_EQ(response.request_id(), request.request_id());
      const std::vector<double> y = OutputAsDoubles(response);
      const auto quantized = Reference(**weights, request, engine::ReferenceMode::kQuantizationAware);
      const auto exact = Reference(**weights, request, engine::ReferenceMode::kUnquantized);
      ASSERT_EQ(y.size(), quantized.size());
      EXPECT_LT(numerics::CalcDiff(y.data(), quantized.data(), y.size()), 1e-4)
          << "dtype " << dtype << " T " << T;
      EXPECT_LT(numerics::CalcDiff(y.data(), exact.data(), y.size()), 0.02);
      EXPECT_GE(numerics::Cosine(y.data(), exact.data(), y.size()), 0.97);
      // Stats describe this step: every routed assignment counted once.
      int64_t assignments = 0;
      for (int64_t l : response.stats().load_before()) assignments += l;
      int64_t used = 0;
      const auto* ids = reinterpret_cast<const int32_t*>(request.topk_ids().data().data());
      for (int i = 0; i < T * spec.top_k; ++i) used += ids[i] >= 0;
      EXPECT_EQ(assignments, used);
      EXPECT_EQ(response.stats().ranks_size(), 2);
      EXPECT_GT(response.stats().engine_ns(), 0);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 9);
}

TEST_F(ServiceTest, BadRequestCatalogueGetsItsCodesAndTheServiceKeepsServing) {
  ASSERT_TRUE(service_->has_value());
  const engine::ModelSpec spec = DefaultModel();
  auto stub = Connect(service().address);
  gcmoe::v1::Stats before;
  {
    grpc::ClientContext context;
    const grpc::Status status = stub->GetStats(&context, {}, &before);
    ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  }
  std::map<std::string, uint64_t> expected_failures;
  int cases = 0;
  for (const BadRequest& bad : BadRequestCatalogue(spec, 2048)) {
    gcmoe::v1::ForwardRequest request = BaseBadRequest(spec);
    bad.mutate(&request);
    gcmoe::v1::ForwardResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub->Forward(&context, request, &response);
    EXPECT_EQ(status.error_code(), bad.code) << bad.name << ": " << status.error_message();
    EXPECT_NE(status.error_message().find(bad.message_contains), std::string::npos)
        << bad.name << ": \"" << status.error_message() << "\"";
    const char* code = bad.code == grpc::StatusCode::NOT_FOUND           ? "NOT_FOUND"
                       : bad.code == grpc::StatusCode::RESOURCE_EXHAUSTED ? "RESOURCE_EXHAUSTED"
                                                                          : "INVALID_ARGUMENT";
    ++expected_failures[code];
    ++cases;
  }
  // Larger than the service's message limit: gRPC itself refuses it.
  {
    gcmoe::v1::ForwardRequest request = BaseBadRequest(spec);
    request.mutable_hidden()->mutable_data()->append(8 << 20, '\0');
    gcmoe::v1::ForwardResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub->Forward(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    ++cases;
  }
  // A deadline that has passed before the call is served.
  {
    gcmoe::v1::ForwardResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() - std::chrono::milliseconds(1));
    const grpc::Status status = stub->Forward(&context, BaseBadRequest(spec), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    ++cases;
  }
  EXPECT_GE(cases, 25);

  EXPECT_EQ(HealthStatus(service().address), "SERVING");
  RequestSpec good;
  good.num_tokens = 16;
  gcmoe::v1::ForwardResponse response;
  grpc::ClientContext context;
  EXPECT_TRUE(stub->Forward(&context, MakeForwardRequest(spec, good), &response).ok());

  gcmoe::v1::Stats after;
  grpc::ClientContext stats_context;
  ASSERT_TRUE(stub->GetStats(&stats_context, {}, &after).ok());
  for (const auto& [code, n] : expected_failures) {
    const uint64_t was = before.failures_by_code().count(code) ? before.failures_by_code().at(code) : 0;
    const uint64_t now = after.failures_by_code().count(code) ? after.failures_by_code().at(code) : 0;
    EXPECT_EQ(now - was, n) << code;
  }
  EXPECT_EQ(after.requests_ok(), before.requests_ok() + 1);
  EXPECT_TRUE(after.serving());
}

TEST_F(ServiceTest, HealthReflectionAndModelInfo) {
  ASSERT_TRUE(service_->has_value());
  EXPECT_EQ(HealthStatus(service().address, ""), "SERVING");
  EXPECT_EQ(HealthStatus(service().address, "gcmoe.v1.MoeService"), "SERVING");

  auto channel = grpc::CreateChannel(service().address, grpc::InsecureChannelCredentials());
  auto reflection = grpc::reflection::v1alpha::ServerReflection::NewStub(channel);
  grpc::ClientContext context;
  auto stream = reflection->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest list;
  list.set_list_services("");
  ASSERT_TRUE(stream->Write(list));
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse reply;
  ASSERT_TRUE(stream->Read(&reply));
  std::vector<std::string> services;
  for (const auto& s : reply.list_services_response().service()) services.push_back(s.name());
  EXPECT_NE(std::find(services.begin(), services.end(), "gcmoe.v1.MoeService"), services.end());
  EXPECT_NE(std::find(services.begin(), services.end(), "grpc.health.v1.Health"), services.end());
  // The rank control service is internal: not on the public port.
  EXPECT_EQ(std::find(services.begin(), services.end(), "gcmoe.internal.v1.RankControl"),
            services.end());
  stream->Finish();

  auto stub = Connect(service().address);
  gcmoe::v1::ModelInfo info;
  grpc::ClientContext info_context;
  ASSERT_TRUE(stub->GetModelInfo(&info_context, {}, &info).ok());
  const engine::ModelSpec spec = DefaultModel();
  EXPECT_EQ(info.hidden(), static_cast<uint32_t>(spec.hidden));
  EXPECT_EQ(info.experts(), static_cast<uint32_t>(spec.num_experts));
  EXPECT_EQ(info.top_k(), static_cast<uint32_t>(spec.top_k));
  EXPECT_EQ(info.layers(), static_cast<uint32_t>(spec.num_layers));
  EXPECT_EQ(info.shared_intermediate(), static_cast<uint32_t>(spec.shared_intermediate));
  EXPECT_EQ(info.ranks(), 2u);
  EXPECT_EQ(info.backend(), "cpu");
  EXPECT_EQ(info.max_tokens(), 2048u);
}

TEST_F(ServiceTest, ASecondServiceOnTheSamePortFailsInsteadOfSharingIt) {
  ASSERT_TRUE(service_->has_value());
  auto second = Process::Start({"serve", "--listen", service().address, "--set",
                                "server.rank_listen=127.0.0.1:0", "--set",
                                "server.metrics_listen=127.0.0.1:0"},
                               TempPath("second.log"));
  const auto status = second->Wait(milliseconds(20000));
  ASSERT_TRUE(status.has_value()) << "a second service started on " << service().address;
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << second->Log();
  EXPECT_NE(second->Log().find("cannot listen on " + service().address), std::string::npos)
      << second->Log();
  EXPECT_EQ(HealthStatus(service().address), "SERVING");
}

TEST_F(ServiceTest, InputsAtTheMagnitudeBoundsNeverReturnNonFiniteOutputs) {
  ASSERT_TRUE(service_->has_value());
  auto stub = Connect(service().address);
  for (const auto output_dtype : {gcmoe::v1::FP32, gcmoe::v1::BF16}) {
    RequestSpec r;
    r.num_tokens = 8;
    r.output_dtype = output_dtype;
    gcmoe::v1::ForwardRequest request = MakeForwardRequest(DefaultModel(), r);
    // Every activation at +-2^32, every routing weight at 2^16: accepted, and then either a
    // finite output or an error naming the output, never OK with Inf or NaN.
    std::string* hidden = request.mutable_hidden()->mutable_data();
    for (size_t i = 0; i < hidden->size() / 4; ++i) {
      const float v = i % 3 == 0 ? -4294967296.0f : 4294967296.0f;
      std::memcpy(hidden->data() + 4 * i, &v, 4);
    }
    std::string* weights = request.mutable_topk_weights()->mutable_data();
    for (size_t i = 0; i < weights->size() / 4; ++i) {
      const float w = 65536.0f;
      std::memcpy(weights->data() + 4 * i, &w, 4);
    }
    gcmoe::v1::ForwardResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub->Forward(&context, request, &response);
    if (status.ok()) {
      for (const double y : OutputAsDoubles(response)) ASSERT_TRUE(std::isfinite(y));
    } else {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_EQ(status.error_message().rfind("output: element", 0), 0u) << status.error_message();
    }
    // Past the bound: refused before any rank sees it.
    const float huge = 3e38f;
    std::memcpy(hidden->data(), &huge, 4);
    grpc::ClientContext refused_context;
    const grpc::Status refused = stub->Forward(&refused_context, request, &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(refused.error_message().find("hidden: element [0, 0] is 3e+38"), std::string::npos)
        << refused.error_message();
  }
}

TEST(ServiceRanksTest, SameRequestIsBitIdenticalThroughOneTwoAndFourRanks) {
  std::vector<Service> services;
  for (int ranks : {1, 2, 4}) {
    auto s = StartServe({"--ranks", std::to_string(ranks), "--set", "engine.threads=1"},
                        "ranks" + std::to_string(ranks), milliseconds(60000));
    ASSERT_TRUE(s.has_value());
    services.push_back(std::move(*s));
  }
  const engine::ModelSpec spec = DefaultModel();
  for (int T : {1, 3, 64, 1024}) {
    for (int hot : {-1, 5}) {
      RequestSpec r;
      r.num_tokens = T;
      r.layer = 1;
      r.unused_every = T % 2 == 1 ? 3 : 0;
      r.hot_expert = hot;
      r.output_dtype = gcmoe::v1::BF16;
      r.seed = 7 * T + hot;
      const gcmoe::v1::ForwardRequest request = MakeForwardRequest(spec, r);
      std::vector<std::string> outputs;
      for (const Service& s : services) {
        auto stub = Connect(s.address);
        gcmoe::v1::ForwardResponse response;
        grpc::ClientContext context;
        const grpc::Status status = stub->Forward(&context, request, &response);
        ASSERT_TRUE(status.ok()) << status.error_message();
        outputs.push_back(response.output().data());
      }
      EXPECT_EQ(outputs[0], outputs[1]) << "T=" << T << " hot=" << hot << ": 1 vs 2 ranks";
      EXPECT_EQ(outputs[0], outputs[2]) << "T=" << T << " hot=" << hot << ": 1 vs 4 ranks";
    }
  }
}

TEST(ServiceLifecycleTest, SigtermDrainsAndEveryProcessExitsCleanly) {
  auto s = StartServe({}, "sigterm", milliseconds(60000));
  ASSERT_TRUE(s.has_value());
  const std::string log_before = s->process->Log();
  auto stub = Connect(s->address);
  RequestSpec r;
  r.num_tokens = 32;
  gcmoe::v1::ForwardResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->Forward(&context, MakeForwardRequest(DefaultModel(), r), &response).ok());

  // The rank pids, from serve's log ("started rank N (pid P)").
  std::vector<pid_t> ranks;
  for (size_t at = 0; (at = log_before.find("(pid ", at)) != std::string::npos; ++at) {
    if (log_before.rfind("started rank", at) != std::string::npos) {
      ranks.push_back(static_cast<pid_t>(std::stol(log_before.substr(at + 5))));
    }
  }
  ASSERT_GE(ranks.size(), 2u) << log_before;

  const auto signalled = std::chrono::steady_clock::now();
  s->process->Signal(SIGTERM);
  const auto status = s->process->Wait(milliseconds(15000));
  // Idle, the drain is immediate and the ranks exit on the coordinator's Shutdown: a guard
  // against waits on restarts (bench numbers: docs/PERFORMANCE.md).
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, milliseconds(5000));
  ASSERT_TRUE(status.has_value()) << "serve did not exit after SIGTERM:\n" << s->process->Log();
  EXPECT_TRUE(WIFEXITED(*status)) << s->process->Log();
  EXPECT_EQ(WEXITSTATUS(*status), 0) << s->process->Log();
  for (pid_t pid : ranks) {
    EXPECT_NE(kill(pid, 0), 0) << "rank pid " << pid << " outlived serve";
  }
  const std::string log = s->process->Log();
  EXPECT_NE(log.find("draining"), std::string::npos) << log;
  // A rank that exits on Shutdown is not restarted, so nothing is refused either.
  EXPECT_EQ(log.find("again (restart"), std::string::npos) << log;
  EXPECT_EQ(log.find("refusing rank"), std::string::npos) << log;
  EXPECT_EQ(log.find("exited with code"), std::string::npos) << log;
  EXPECT_EQ(log.find("[error]"), std::string::npos) << log;
  // No exchange segment left behind: serve's log names each rank's ("transport /gcmoe-...").
  int segments = 0;
  for (size_t at = 0; (at = log.find("transport /", at)) != std::string::npos; ++at) {
    const size_t begin = at + 10;
    const std::string name = log.substr(begin, log.find(')', begin) - begin);
    EXPECT_FALSE(std::filesystem::exists("/dev/shm" + name)) << name << " left behind";
    ++segments;
  }
  EXPECT_GE(segments, 2) << log;
}

}  // namespace
}  // namespace gcmoe::server::testing
