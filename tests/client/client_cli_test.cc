// `gcmoe client` end to end against an in-process fake MoeService on loopback: the real
// command, the real channel and stubs, a service that echoes y = 2x.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "client/command.h"
#include "client/npy.h"
#include "common/number_formats.h"
#include "gcmoe/v1/moe.grpc.pb.h"

namespace gcmoe::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr int kHidden = 64;

// Decodes any hidden encoding the API allows, to floats.
std::vector<float> DecodeHidden(const v1::ForwardRequest& r) {
  const int64_t tokens = r.hidden().shape(0);
  const std::string& data = r.hidden().data();
  std::vector<float> x(static_cast<size_t>(tokens) * kHidden);
  if (r.hidden().dtype() == v1::FP32) {
    std::memcpy(x.data(), data.data(), x.size() * 4);
  } else if (r.hidden().dtype() == v1::BF16) {
    for (size_t i = 0; i < x.size(); ++i) {
      uint16_t bits;
      std::memcpy(&bits, data.data() + 2 * i, 2);
      x[i] = numerics::BF16ToFloat(bits);
    }
  } else {
    const auto* codes = reinterpret_cast<const uint8_t*>(data.data());
    const auto* scales = reinterpret_cast<const uint8_t*>(r.hidden_scales().data().data());
    for (int64_t t = 0; t < tokens; ++t) {
      numerics::DequantizeE4M3K32(codes + t * kHidden, scales + t * (kHidden / 32), kHidden,
                                  x.data() + t * kHidden);
    }
  }
  return x;
}

class FakeMoeService final : public v1::MoeService::Service {
 public:
  grpc::Status GetModelInfo(grpc::ServerContext*, const v1::GetModelInfoRequest*,
                            v1::ModelInfo* info) override {
    info->set_hidden(kHidden);
    info->set_intermediate(32);
    info->set_experts(8);
    info->set_top_k(2);
    info->set_layers(2);
    info->set_activation_alpha(1.0f);
    info->set_activation_clamp_enabled(true);
    info->set_activation_clamp(10.0f);
    info->set_ranks(2);
    info->set_backend("cpu");
    info->set_max_tokens(256);
    info->set_balancer_enabled(true);
    info->set_version("fake");
    info->set_weights("synthetic:1");
    info->set_routed_weight_format("E2M1 (FP4) with UE8M0 scales per 32 along K");
    info->add_hidden_dtypes(v1::BF16);
    info->add_hidden_dtypes(v1::FP32);
    info->add_hidden_dtypes(v1::FP8_E4M3);
    info->add_output_dtypes(v1::BF16);
    info->add_output_dtypes(v1::FP32);
    info->set_max_message_bytes(1 << 20);
    info->add_memory_kinds("posix_shm");
    return grpc::Status::OK;
  }

  grpc::Status Forward(grpc::ServerContext*, const v1::ForwardRequest* request,
                       v1::ForwardResponse* response) override {
    const int call = calls.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu);
      last_request = *request;
    }
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    if (fail_every > 0 && call % fail_every == fail_every - 1) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "rank 1 is not ready");
    }
    const int64_t tokens = request->hidden().shape(0);
    std::vector<float> y = DecodeHidden(*request);
    for (float& v : y) v = emit_nan ? NAN : 2.0f * v;
    v1::Tensor* out = response->mutable_output();
    out->add_shape(tokens);
    out->add_shape(kHidden);
    if (request->output_dtype() == v1::FP32) {
      out->set_dtype(v1::FP32);
      out->set_data(reinterpret_cast<const char*>(y.data()), y.size() * 4);
    } else {
      out->set_dtype(v1::BF16);
      std::vector<uint16_t> bits(y.size());
      for (size_t i = 0; i < y.size(); ++i) bits[i] = numerics::FloatToBF16(y[i]);
      out->set_data(reinterpret_cast<const char*>(bits.data()), bits.size() * 2);
    }
    response->set_request_id(request->request_id());
    v1::ForwardStats* stats = response->mutable_stats();
    const int64_t assignments = tokens * 2;
    stats->add_load_before(assignments * 3 / 4);
    stats->add_load_before(assignments / 4);
    stats->add_load_after(assignments / 2);
    stats->add_load_after(assignments / 2);
    stats->set_balancer_enabled(true);
    stats->set_relief_passes(12);
    stats->set_relief_solve_ns(4000);
    stats->set_engine_ns(1500000);
    stats->set_total_ns(2000000);
    return grpc::Status::OK;
  }

  grpc::Status GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                        v1::Stats* stats) override {
    stats->set_uptime_s(12.5);
    stats->set_requests_ok(10);
    stats->set_requests_failed(2);
    (*stats->mutable_failures_by_code())["UNAVAILABLE"] = 2;
    stats->set_tokens_total(640);
    stats->mutable_latency()->set_count(12);
    stats->mutable_latency()->set_p50_us(900);
    stats->set_spatial_utilization_before(0.5);
    stats->set_spatial_utilization_after(0.95);
    stats->set_serving(true);
    stats->set_steps(10);
    for (uint32_t r = 0; r < 2; ++r) {
      v1::RankStats* rank = stats->add_ranks();
      rank->set_rank(r);
      rank->set_ready(r == 0);
      rank->set_restarts(r);
    }
    return grpc::Status::OK;
  }

  std::atomic<int> calls{0};
  std::atomic<int> fail_every{0};
  std::atomic<int> delay_ms{0};
  std::atomic<bool> emit_nan{false};
  std::mutex mu;
  v1::ForwardRequest last_request;
};

struct CommandResult {
  int exit_code;
  std::string out;
  std::string err;
};

CommandResult RunClient(std::vector<std::string> args) {
  args.insert(args.begin(), "client");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int rc = RunClientCommand(static_cast<int>(args.size()), argv.data());
  std::string out = ::testing::internal::GetCapturedStdout();
  std::string err = ::testing::internal::GetCapturedStderr();
  return {rc, out, err};
}

class ClientCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    addr_ = "127.0.0.1:" + std::to_string(port);
  }
  void TearDown() override { server_->Shutdown(); }

  FakeMoeService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string addr_;
};

TEST_F(ClientCliTest, HealthPrintsTheServingStatus) {
  CommandResult r = RunClient({"health", "--addr", addr_});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "SERVING\n");

  server_->GetHealthCheckService()->SetServingStatus(false);
  r = RunClient({"health", "--addr", addr_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "NOT_SERVING\n");

  r = RunClient({"health", "--addr", addr_, "--service", "no.such.Service"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "SERVICE_UNKNOWN\n");
  EXPECT_THAT(r.err, HasSubstr("no.such.Service"));
}

TEST_F(ClientCliTest, InfoPrintsTheModel) {
  CommandResult r = RunClient({"info", "--addr", addr_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("gcmoe fake at " + addr_ + "\n"));
  EXPECT_THAT(r.out, HasSubstr("H=64 I=32 E=8 top-2, 2 layers, no shared expert"));
  EXPECT_THAT(r.out, HasSubstr("SwiGLU, alpha 1, clamp 10.000"));
  EXPECT_THAT(r.out, HasSubstr("hidden bf16, fp32, fp8_e4m3; output bf16, fp32"));
  EXPECT_THAT(r.out, HasSubstr("2 ranks, cpu backend, balancer on"));
  EXPECT_THAT(r.out, HasSubstr("256 tokens per request, 1.0 MiB per message"));
  EXPECT_THAT(r.out, HasSubstr("registered  posix_shm\n"));

  r = RunClient({"info", "--addr", addr_, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json info = nlohmann::json::parse(r.out);
  EXPECT_EQ(info["hidden"], 64);
  EXPECT_EQ(info["backend"], "cpu");
}

TEST_F(ClientCliTest, StatsPrintsCountersAndRanks) {
  CommandResult r = RunClient({"stats", "--addr", addr_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("gcmoe at " + addr_ + ": serving, up 12.5 s, 10 steps\n"));
  EXPECT_THAT(r.out, HasSubstr("10 ok, 2 failed (UNAVAILABLE 2)"));
  EXPECT_THAT(r.out, HasSubstr("mean(L)/max(L) 0.500 unbalanced -> 0.950 balanced"));
  EXPECT_THAT(r.out, HasSubstr("rank 0     ready, 0 restarts"));
  EXPECT_THAT(r.out, HasSubstr("rank 1     NOT ready, 1 restart,"));

  r = RunClient({"stats", "--addr", addr_, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json stats = nlohmann::json::parse(r.out);
  EXPECT_EQ(stats["requests_ok"], "10");  // proto3 JSON writes 64-bit integers as strings
  EXPECT_EQ(stats["failures_by_code"]["UNAVAILABLE"], "2");
  EXPECT_EQ(stats["ranks"].size(), 2u);
}

TEST_F(ClientCliTest, ForwardSendsRandomRequestsAndSummarizes) {
  const CommandResult r = RunClient({"forward", "--addr", addr_, "--tokens", "16", "--requests",
                                     "10", "--concurrency", "3", "--warmup", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(service_.calls, 12);  // warm-up calls are sent but not counted
  EXPECT_THAT(r.out, HasSubstr("H=64 E=8 top-2, 2 ranks, cpu backend, balancer on"));
  EXPECT_THAT(r.out, HasSubstr("10 x 16 tokens (bf16 in, bf16 out, layer 0, random, skew 0), "
                               "concurrency 3, warm-up 2"));
  EXPECT_THAT(r.out, HasSubstr("10 sent, 10 ok, 0 failed"));
  EXPECT_THAT(r.out, HasSubstr("engine p50 1500.0 mean 1500.0 us; total p50 2000.0 us"));
  EXPECT_THAT(r.out, HasSubstr("mean(L)/max(L) 0.667 before -> 1.000 after balancing; relief 12.0 "
                               "passes, 4.00 us"));
  EXPECT_THAT(r.out, HasSubstr("load per rank, summed: before [240 80] after [160 160]"));
  EXPECT_THAT(r.out, HasSubstr("[16, 64] bf16, mean |y| "));
  EXPECT_THAT(r.out, HasSubstr("NaN 0, Inf 0"));

  std::lock_guard<std::mutex> lock(service_.mu);
  const v1::ForwardRequest& last = service_.last_request;
  EXPECT_EQ(last.hidden().dtype(), v1::BF16);
  EXPECT_THAT(last.hidden().shape(), ::testing::ElementsAre(16, 64));
  EXPECT_EQ(last.hidden().data().size(), 16u * 64 * 2);
  EXPECT_THAT(last.topk_ids().shape(), ::testing::ElementsAre(16, 2));
  EXPECT_EQ(last.topk_weights().dtype(), v1::FP32);
}

TEST_F(ClientCliTest, ForwardFp8InFp32OutSavesTheOutput) {
  const std::string path = ::testing::TempDir() + "client_cli_out.npy";
  std::filesystem::remove(path);
  const CommandResult r =
      RunClient({"forward", "--addr", addr_, "--tokens", "16", "--requests", "1", "--warmup", "0",
                 "--dtype", "fp8", "--output-dtype", "fp32", "--layer", "1", "--save", path});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("(fp8_e4m3 in, fp32 out, layer 1,"));
  EXPECT_THAT(r.out, HasSubstr("saved       " + path));

  std::vector<float> expected;
  {
    std::lock_guard<std::mutex> lock(service_.mu);
    const v1::ForwardRequest& last = service_.last_request;
    EXPECT_EQ(last.layer(), 1u);
    EXPECT_EQ(last.hidden().dtype(), v1::FP8_E4M3);
    EXPECT_THAT(last.hidden_scales().shape(), ::testing::ElementsAre(16, 2));
    expected = DecodeHidden(last);
  }
  for (float& v : expected) v *= 2.0f;
  Result<client::NpyArray> saved = client::ReadNpy(path);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_THAT(saved->shape, ::testing::ElementsAre(16, 64));
  Result<std::vector<float>> values = client::NpyToFloat(*saved, path);
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(*values, expected);
}

TEST_F(ClientCliTest, ForwardCountsFailuresByCodeAndFails) {
  service_.fail_every = 4;
  const CommandResult r = RunClient({"forward", "--addr", addr_, "--tokens", "4", "--requests", "8",
                                     "--concurrency", "2", "--warmup", "0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("8 sent, 6 ok, 2 failed"));
  EXPECT_THAT(r.out, HasSubstr("UNAVAILABLE x2: rank 1 is not ready"));
}

TEST_F(ClientCliTest, ForwardReportsDeadlinesAsFailuresNotAsUnreachable) {
  service_.delay_ms = 300;
  const CommandResult r = RunClient({"forward", "--addr", addr_, "--tokens", "4", "--requests", "1",
                                     "--warmup", "0", "--deadline-ms", "30"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("1 sent, 0 ok, 1 failed"));
  EXPECT_THAT(r.out, HasSubstr("DEADLINE_EXCEEDED x1"));
}

TEST_F(ClientCliTest, ForwardFailsOnNonFiniteOutputs) {
  service_.emit_nan = true;
  const CommandResult r =
      RunClient({"forward", "--addr", addr_, "--tokens", "4", "--requests", "2", "--warmup", "0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out, HasSubstr("2 sent, 2 ok, 0 failed"));
  EXPECT_THAT(r.out, HasSubstr("NaN 512, Inf 0"));
}

TEST_F(ClientCliTest, ForwardSendsARequestReadFromNpyFiles) {
  const std::string dir = ::testing::TempDir() + "client_cli_request";
  std::filesystem::create_directories(dir);
  std::vector<float> hidden(3 * kHidden);
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = 0.25f * static_cast<float>(i % 7);
  ASSERT_TRUE(client::WriteNpyFloat32(dir + "/hidden.npy", {3, kHidden}, hidden).ok());
  ASSERT_TRUE(client::WriteNpyFloat32(dir + "/topk_weights.npy", {3, 2},
                                      {0.5f, 0.5f, 0.75f, 0.25f, 1.0f, 0.0f})
                  .ok());
  // topk_ids.npy as np.save writes int64: header, then the little-endian values.
  {
    std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (3, 2), }";
    header.append(117 - header.size(), ' ');
    header += '\n';
    std::ofstream out(dir + "/topk_ids.npy", std::ios::binary);
    out.write("\x93NUMPY\x01\x00\x76\x00", 10);
    out << header;
    for (const int64_t id : {1, 2, 3, 4, 5, -1}) out.write(reinterpret_cast<const char*>(&id), 8);
  }
  const CommandResult r = RunClient({"forward", "--addr", addr_, "--input", dir, "--requests", "1",
                                     "--warmup", "0", "--dtype", "fp32"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("1 x 3 tokens (fp32 in, bf16 out, layer 0, from " + dir + ")"));
  std::lock_guard<std::mutex> lock(service_.mu);
  const v1::ForwardRequest& last = service_.last_request;
  EXPECT_EQ(DecodeHidden(last), hidden);
  std::vector<int32_t> ids(6);
  ASSERT_EQ(last.topk_ids().data().size(), 24u);
  std::memcpy(ids.data(), last.topk_ids().data().data(), 24);
  EXPECT_THAT(ids, ::testing::ElementsAre(1, 2, 3, 4, 5, -1));
}

TEST(ClientCli, UnreachableServiceIsReportedAsSuch) {
  for (const char* command : {"health", "info", "stats", "forward"}) {
    const CommandResult r = RunClient({command, "--addr", "127.0.0.1:1", "--timeout-ms", "5000"});
    EXPECT_EQ(r.exit_code, 1) << command;
    EXPECT_THAT(r.err, StartsWith("cannot reach 127.0.0.1:1: ")) << command;
  }
}

TEST(ClientCli, TokenOverPlaintextOnlyToLoopback) {
  const std::string token_file = ::testing::TempDir() + "/client_cli_token";
  std::ofstream(token_file) << "a-token\n";
  // Refused before any connection: the token would cross the network in the clear.
  for (const char* addr : {"192.0.2.1:50051", "dns:///gcmoe.example:50051", "[2001:db8::1]:1"}) {
    const CommandResult r =
        RunClient({"health", "--addr", addr, "--token-file", token_file.c_str()});
    EXPECT_EQ(r.exit_code, 2) << addr;
    EXPECT_THAT(r.err, HasSubstr("--token-file needs TLS (--tls or --tls-ca) to reach")) << addr;
  }
  // Loopback and Unix sockets may: these are dialled (and nothing listens there).
  for (const char* addr : {"127.0.0.1:1", "127.8.9.10:1", "localhost:1", "[::1]:1",
                           "ipv4:127.0.0.1:1", "unix:/nonexistent/gcmoe.sock"}) {
    const CommandResult r = RunClient({"health", "--addr", addr, "--token-file",
                                       token_file.c_str(), "--timeout-ms", "5000"});
    EXPECT_EQ(r.exit_code, 1) << addr << ": " << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("needs TLS"))) << addr;
  }
}

TEST(ClientCli, UsageAndFlagErrors) {
  CommandResult r = RunClient({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("forward  send Forward requests"));
  for (const char* command : {"health", "info", "stats", "forward"}) {
    r = RunClient({command, "--help"});
    EXPECT_EQ(r.exit_code, 0) << command;
    EXPECT_THAT(r.out, StartsWith(std::string("usage: gcmoe client ") + command)) << command;
  }
  r = RunClient({"forward", "--dtype", "int8"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--dtype: expected bf16, fp32 or fp8, got \"int8\""));
  r = RunClient({"forward", "--output-dtype", "fp8"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(RunClient({"forward", "--concurrency", "0"}).exit_code, 2);
  EXPECT_EQ(RunClient({"teleport"}).exit_code, 2);
  EXPECT_EQ(RunClient({}).exit_code, 2);
}

}  // namespace
}  // namespace gcmoe::client
