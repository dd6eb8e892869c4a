// The GPU memory a rank reports reaches GetStats and the Prometheus endpoint: two ranks speaking
// the attach protocol (one reporting a GPU, one not, as a rank on the CPU backend) join a
// coordinator; their Ready and step results carry what a CUDA rank's driver query would, and the
// test reads it back from both public surfaces, then sees it go when the rank leaves. The driver
// query itself (CudaBackend::QueryDeviceMemory) is checked on the GPU in the kernels' GPU test.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "config/config.h"
#include "engine/shm_exchange.h"
#include "gcmoe/internal/v1/rank.grpc.pb.h"
#include "server/attach_secret.h"
#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

namespace internal = gcmoe::internal::v1;

constexpr int64_t kGiB = int64_t{1} << 30;

// A rank that attaches with the secret's proof, answers every Setup with Ready and every Step
// with an all-zero output of the right shape, and attaches `memory` to its Ready and to the
// result of each step while it is set. Runs until Stop() or the coordinator ends the stream.
class ReportingRank {
 public:
  ReportingRank(const std::string& rank_address, int rank, const AttachSecret& secret,
                const std::string& transport, int hidden)
      : hidden_(hidden) {
    stub_ = internal::RankControl::NewStub(
        grpc::CreateChannel(rank_address, grpc::InsecureChannelCredentials()));
    thread_ = std::thread([this, rank, secret, transport] { Run(rank, secret, transport); });
  }
  ~ReportingRank() { Stop(); }

  void SetMemory(std::optional<gcmoe::v1::GpuMemory> memory) {
    std::lock_guard<std::mutex> lock(mu_);
    memory_ = std::move(memory);
  }
  int steps() const { return steps_.load(); }
  void Stop() {
    context_.TryCancel();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run(int rank, const AttachSecret& secret, const std::string& transport) {
    auto stream = stub_->Attach(&context_);
    internal::CoordinatorMessage message;
    if (!stream->Read(&message) || !message.has_challenge()) return;
    internal::Hello hello;
    hello.set_rank(rank);
    hello.set_world_size(2);
    hello.set_config_digest(config::DefaultConfig().Digest());
    hello.set_pid(999990 + rank);
    hello.set_incarnation(77 + rank);
    hello.set_transport_name(transport);
    hello.set_host("elsewhere");  // another host: tensors travel inline
    hello.set_attach_proof(secret.Proof(message.challenge().nonce(), hello));
    internal::RankMessage first;
    *first.mutable_hello() = hello;
    if (!stream->Write(first)) return;
    while (stream->Read(&message)) {
      internal::RankMessage reply;
      std::optional<gcmoe::v1::GpuMemory> memory;
      {
        std::lock_guard<std::mutex> lock(mu_);
        memory = memory_;
      }
      if (message.has_setup()) {
        reply.mutable_ready()->set_epoch(message.setup().epoch());
        if (memory) *reply.mutable_ready()->mutable_gpu_memory() = *memory;
      } else if (message.has_step()) {
        const internal::Step& step = message.step();
        internal::StepResult* result = reply.mutable_step_result();
        result->set_generation(step.generation());
        const int rows = static_cast<int>(step.tokens_per_rank(rank));
        const bool fp32 = step.output_dtype() == gcmoe::v1::FP32;
        gcmoe::v1::Tensor* out = result->mutable_output();
        out->set_dtype(fp32 ? gcmoe::v1::FP32 : gcmoe::v1::BF16);
        out->add_shape(rows);
        out->add_shape(hidden_);
        out->set_data(std::string(static_cast<size_t>(rows) * hidden_ * (fp32 ? 4 : 2), '\0'));
        for (int r = 0; r < step.tokens_per_rank_size(); ++r) {
          result->add_load_before(0);
          result->add_load_after(0);
        }
        if (memory) *result->mutable_gpu_memory() = *memory;
        ++steps_;
      } else {
        continue;
      }
      if (!stream->Write(reply)) break;
    }
    stream->Finish();
  }

  const int hidden_;
  std::unique_ptr<internal::RankControl::Stub> stub_;
  grpc::ClientContext context_;
  std::thread thread_;
  std::mutex mu_;
  std::optional<gcmoe::v1::GpuMemory> memory_;
  std::atomic<int> steps_{0};
};

gcmoe::v1::GpuMemory Memory(int device, int64_t used, int64_t total) {
  gcmoe::v1::GpuMemory memory;
  memory.set_device(device);
  memory.set_used_bytes(used);
  memory.set_total_bytes(total);
  return memory;
}

// GET http://address/metrics over a plain socket; "" when it cannot connect.
std::string Scrape(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr) != 1) return "";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  std::string text;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string get = "GET /metrics HTTP/1.0\r\nHost: " + address + "\r\n\r\n";
    if (write(fd, get.data(), get.size()) == static_cast<ssize_t>(get.size())) {
      char buffer[4096];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) text.append(buffer, n);
    }
  }
  close(fd);
  return text;
}

// The value of the sample line that starts with `series` ("name{labels}"), if there is one.
std::optional<double> Sample(const std::string& text, const std::string& series) {
  size_t at = 0;
  while ((at = text.find(series + " ", at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + series.size() + 1));
    at += series.size();
  }
  return std::nullopt;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::optional<gcmoe::v1::Stats> Stats(gcmoe::v1::MoeService::Stub& stub) {
  gcmoe::v1::Stats stats;
  grpc::ClientContext context;
  if (!stub.GetStats(&context, {}, &stats).ok()) return std::nullopt;
  return stats;
}

TEST(GpuMemoryReportTest, WhatRanksReportReachesStatsAndMetricsAndGoesWithTheRank) {
  SeparateProcesses service("gpu-memory", {}, /*ranks=*/0);
  ASSERT_FALSE(service.metrics_address().empty()) << service.Logs();
  const AttachSecret secret = AttachSecret::FromBytes(ReadLine(service.secret_file()));
  const std::string instance = secret.InstanceName(config::DefaultConfig().Digest());
  const int hidden = DefaultModel().hidden;

  auto gpu_rank = std::make_unique<ReportingRank>(
      service.rank_address(), 0, secret, engine::ShmExchange::SegmentName(instance, 0), hidden);
  gpu_rank->SetMemory(Memory(3, 40 * kGiB, 141 * kGiB));
  ReportingRank cpu_rank(service.rank_address(), 1, secret,
                         engine::ShmExchange::SegmentName(instance, 1), hidden);
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(30000))) << service.Logs();

  auto stub = Connect(service.address());
  auto stats = Stats(*stub);
  ASSERT_TRUE(stats);
  ASSERT_EQ(stats->ranks_size(), 2);
  ASSERT_TRUE(stats->ranks(0).has_gpu_memory()) << stats->DebugString();
  EXPECT_EQ(stats->ranks(0).gpu_memory().device(), 3);
  EXPECT_EQ(stats->ranks(0).gpu_memory().used_bytes(), 40 * kGiB);
  EXPECT_EQ(stats->ranks(0).gpu_memory().total_bytes(), 141 * kGiB);
  EXPECT_FALSE(stats->ranks(1).has_gpu_memory()) << "a rank without a GPU reports none";

  std::string metrics = Scrape(service.metrics_address());
  EXPECT_EQ(Sample(metrics, "gcmoe_gpu_memory_used_bytes{device=\"3\",rank=\"0\"}"),
            static_cast<double>(40 * kGiB))
      << metrics;
  EXPECT_EQ(Sample(metrics, "gcmoe_gpu_memory_total_bytes{device=\"3\",rank=\"0\"}"),
            static_cast<double>(141 * kGiB))
      << metrics;
  EXPECT_EQ(Count(metrics, "\ngcmoe_gpu_memory_used_bytes{"), 1) << "rank 1 has no GPU\n" << metrics;

  // A step's result carries a newer sample.
  gpu_rank->SetMemory(Memory(3, 52 * kGiB, 141 * kGiB));
  RequestSpec spec;
  spec.num_tokens = 6;
  spec.seed = 5;
  gcmoe::v1::ForwardResponse response;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + milliseconds(20000));
    const grpc::Status status =
        stub->Forward(&context, MakeForwardRequest(DefaultModel(), spec), &response);
    ASSERT_TRUE(status.ok()) << status.error_message() << "\n" << service.Logs();
  }
  EXPECT_EQ(gpu_rank->steps(), 1);
  stats = Stats(*stub);
  ASSERT_TRUE(stats && stats->ranks(0).has_gpu_memory());
  EXPECT_EQ(stats->ranks(0).gpu_memory().used_bytes(), 52 * kGiB);
  metrics = Scrape(service.metrics_address());
  EXPECT_EQ(Sample(metrics, "gcmoe_gpu_memory_used_bytes{device=\"3\",rank=\"0\"}"),
            static_cast<double>(52 * kGiB))
      << metrics;

  // The rank leaves: its last report is not shown as current.
  gpu_rank.reset();
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(20000);
  while (std::chrono::steady_clock::now() < deadline) {
    stats = Stats(*stub);
    if (stats && !stats->ranks(0).ready()) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_TRUE(stats);
  EXPECT_FALSE(stats->ranks(0).ready());
  EXPECT_FALSE(stats->ranks(0).has_gpu_memory()) << stats->DebugString();
  metrics = Scrape(service.metrics_address());
  EXPECT_NE(metrics.find("gcmoe_rank_ready"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("gcmoe_gpu_memory_used_bytes"), std::string::npos) << metrics;
}

}  // namespace
}  // namespace gcmoe::server::testing
