// Messages over server.max_message_bytes: eight at once are each refused with
// RESOURCE_EXHAUSTED while they stream in, the coordinator's memory stays within twice its idle
// size plus twice the limit (gRPC's resource quota on the public port), and the service serves
// on. bench/oversize_rss.py measures the same with 256 MiB calls.
#include <atomic>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

int64_t RssBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

TEST(MessageLimitsTest, ConcurrentOversizeCallsAreRefusedWithinBoundedMemory) {
  // A quota of 8 MiB (the default is at least 256 MiB) against 8 calls of 16 MiB each.
  const int64_t quota = 8 << 20;
  auto s = StartServe({"--set", "server.receive_quota_bytes=" + std::to_string(quota)}, "oversize",
                      milliseconds(60000));
  ASSERT_TRUE(s.has_value());
  auto stub = Connect(s->address);
  gcmoe::v1::ModelInfo info;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->GetModelInfo(&context, {}, &info).ok());
  }
  const int64_t limit = static_cast<int64_t>(info.max_message_bytes());
  ASSERT_GT(limit, 0);
  std::this_thread::sleep_for(milliseconds(500));
  const int64_t idle = RssBytes(s->process->pid());
  ASSERT_GT(idle, 0);

  // Far over the limit: the hidden tensor alone is 16 MiB (its shape does not matter, the
  // size is refused before anything is parsed).
  gcmoe::v1::ForwardRequest oversize;
  oversize.mutable_hidden()->set_dtype(gcmoe::v1::FP32);
  oversize.mutable_hidden()->mutable_data()->assign(16 << 20, '\0');
  ASSERT_GT(static_cast<int64_t>(oversize.ByteSizeLong()), 4 * limit);

  std::atomic<bool> sampling{true};
  std::atomic<int64_t> peak{idle};
  std::thread sampler([&] {
    while (sampling.load()) {
      const int64_t rss = RssBytes(s->process->pid());
      if (rss > peak.load()) peak = rss;
      std::this_thread::sleep_for(milliseconds(5));
    }
  });
  std::vector<grpc::Status> statuses(8);
  std::vector<std::thread> callers;
  for (int i = 0; i < 8; ++i) {
    callers.emplace_back([&, i] {
      auto own_stub = Connect(s->address);
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + milliseconds(120000));
      gcmoe::v1::ForwardResponse response;
      statuses[i] = own_stub->Forward(&context, oversize, &response);
    });
  }
  for (std::thread& t : callers) t.join();
  std::this_thread::sleep_for(milliseconds(200));
  sampling = false;
  sampler.join();

  // Each is refused while it streams in: RESOURCE_EXHAUSTED, or, when the quota is under
  // pressure from the others, its connection closed by gRPC's reclaimer (UNAVAILABLE, GOAWAY),
  // which a client may retry. Never OK, never a crash.
  for (int i = 0; i < 8; ++i) {
    const grpc::Status& status = statuses[i];
    const bool goaway = status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                        status.error_message().find("GOAWAY") != std::string::npos;
    EXPECT_TRUE(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED || goaway)
        << "call " << i << ": code " << status.error_code() << ", " << status.error_message();
  }
  EXPECT_LE(peak.load(), 2 * idle + quota)
      << "idle " << idle << " bytes, peak " << peak.load() << ", quota " << quota;

  // The service is unharmed.
  RequestSpec r;
  r.num_tokens = 16;
  gcmoe::v1::ForwardResponse response;
  grpc::ClientContext context;
  EXPECT_TRUE(stub->Forward(&context, MakeForwardRequest(DefaultModel(), r), &response).ok())
      << s->process->Log();
}

}  // namespace
}  // namespace gcmoe::server::testing
