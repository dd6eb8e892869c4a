// The service's data path: the same requests sent inline (ranks get tensors in their messages),
// through the ranks' shared-memory I/O regions, on one ForwardStream, and merged with other
// concurrent callers into shared steps must all come back byte-identical; a bad message on a
// stream gets its own error and the stream goes on.
#include <future>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

// Requests of several sizes and every input dtype; the token counts are not multiples of the
// rank count, so shards are uneven and merged steps split calls across ranks.
gcmoe::v1::ForwardResponse Forward(const std::string& address,
                                   const gcmoe::v1::ForwardRequest& request) {
  auto stub = Connect(address);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  gcmoe::v1::ForwardResponse response;
  const grpc::Status status = stub->Forward(&context, request, &response);
  EXPECT_TRUE(status.ok()) << request.request_id() << ": " << status.error_message();
  return response;
}

TEST(DataPathTest, InlineSharedMemoryStreamedAndMergedOutputsAreByteIdentical) {
  auto inline_service = StartServe(TwoRanksWith({"--set", "server.rank_io=inline"}), "dp_inline",
                                   milliseconds(60000));
  // Every step waits 50 ms for more calls: concurrent callers share steps.
  auto shm_service = StartServe(TwoRanksWith({"--set", "server.batch_window_us=50000"}), "dp_shm",
                                milliseconds(60000));
  ASSERT_TRUE(inline_service && shm_service);
  const std::vector<gcmoe::v1::ForwardRequest> requests = DataPathRequests(100, "req-");

  // The reference: each request alone, tensors inline.
  std::vector<std::string> reference;
  for (const auto& request : requests) {
    const gcmoe::v1::ForwardResponse r = Forward(inline_service->address, request);
    EXPECT_FALSE(r.stats().shared_memory_io());
    EXPECT_EQ(r.stats().batched_calls(), 1u);
    ASSERT_FALSE(r.output().data().empty()) << request.request_id();
    reference.push_back(r.output().data());
  }

  // Alone, through shared memory.
  for (size_t i = 0; i < requests.size(); ++i) {
    const gcmoe::v1::ForwardResponse r = Forward(shm_service->address, requests[i]);
    EXPECT_TRUE(r.stats().shared_memory_io()) << shm_service->process->Log();
    EXPECT_EQ(r.stats().batched_calls(), 1u);
    EXPECT_EQ(r.request_id(), requests[i].request_id());
    EXPECT_EQ(r.output().data(), reference[i]) << requests[i].request_id() << " (shared memory)";
  }

  // On one stream, in order, with a bad message in the middle that does not end it.
  {
    auto stub = Connect(shm_service->address);
    grpc::ClientContext context;
    auto stream = stub->ForwardStream(&context);
    gcmoe::v1::ForwardRequest bad = requests[0];
    bad.set_layer(999);
    bad.set_request_id("bad");
    std::vector<const gcmoe::v1::ForwardRequest*> sent;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (i == requests.size() / 2) sent.push_back(&bad);
      sent.push_back(&requests[i]);
    }
    for (const auto* request : sent) ASSERT_TRUE(stream->Write(*request));
    stream->WritesDone();
    size_t next = 0;
    gcmoe::v1::ForwardStreamResponse reply;
    while (stream->Read(&reply)) {
      ASSERT_LT(next, sent.size());
      EXPECT_EQ(reply.request_id(), sent[next]->request_id());
      if (sent[next] == &bad) {
        EXPECT_EQ(reply.code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
        EXPECT_NE(reply.message().find("layer"), std::string::npos) << reply.message();
        EXPECT_FALSE(reply.has_response());
      } else {
        const size_t i = sent[next] - requests.data();
        EXPECT_EQ(reply.code(), 0) << reply.message();
        EXPECT_EQ(reply.response().output().data(), reference[i])
            << requests[i].request_id() << " (stream)";
      }
      ++next;
    }
    EXPECT_EQ(next, sent.size());
    EXPECT_TRUE(stream->Finish().ok());
  }

  // Concurrently: calls for the same layer and dtypes share steps, each gets its own rows.
  std::vector<std::future<gcmoe::v1::ForwardResponse>> calls;
  for (const auto& request : requests) {
    calls.push_back(
        std::async(std::launch::async, [&] { return Forward(shm_service->address, request); }));
  }
  uint32_t most_merged = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    const gcmoe::v1::ForwardResponse r = calls[i].get();
    most_merged = std::max(most_merged, r.stats().batched_calls());
    EXPECT_EQ(r.request_id(), requests[i].request_id());
    EXPECT_EQ(r.output().data(), reference[i]) << requests[i].request_id() << " (merged)";
  }
  EXPECT_GT(most_merged, 1u) << "no two concurrent calls shared a step";
}

TEST(DataPathTest, PipelinedStepsOverlapAndReturnTheBytesOfStepsOneAtATime) {
  // One call per step (no merging), so concurrent callers make many steps back to back.
  auto pipelined = StartServe(TwoRanksWith({"--set", "server.max_batch_calls=1"}), "dp_pipelined",
                              milliseconds(60000));
  auto one_at_a_time = StartServe(
      TwoRanksWith({"--set", "server.max_batch_calls=1", "--set", "server.max_steps_in_flight=1"}),
      "dp_serial", milliseconds(60000));
  ASSERT_TRUE(pipelined && one_at_a_time);
  const std::vector<gcmoe::v1::ForwardRequest> requests = DataPathRequests(300, "pipe-");
  std::vector<std::string> reference;
  for (const auto& request : requests) {
    const gcmoe::v1::ForwardResponse r = Forward(one_at_a_time->address, request);
    EXPECT_EQ(r.stats().steps_in_flight(), 1u);
    reference.push_back(r.output().data());
  }

  // Every request four times over, all at once: each call its own step.
  constexpr int kRounds = 4;
  auto run_all = [&](const std::string& address, const char* what) {
    std::vector<std::future<gcmoe::v1::ForwardResponse>> calls;
    for (int round = 0; round < kRounds; ++round) {
      for (const auto& request : requests) {
        calls.push_back(std::async(std::launch::async,
                                   [&address, &request] { return Forward(address, request); }));
      }
    }
    uint32_t most_in_flight = 0;
    for (size_t i = 0; i < calls.size(); ++i) {
      const gcmoe::v1::ForwardResponse r = calls[i].get();
      const size_t j = i % requests.size();
      EXPECT_EQ(r.stats().batched_calls(), 1u);
      EXPECT_GE(r.stats().steps_in_flight(), 1u);
      most_in_flight = std::max(most_in_flight, r.stats().steps_in_flight());
      EXPECT_EQ(r.output().data(), reference[j]) << requests[j].request_id() << " (" << what << ")";
    }
    return most_in_flight;
  };
  EXPECT_EQ(run_all(pipelined->address, "pipelined"), 2u)
      << "no step was sent while another ran: " << pipelined->process->Log();
  EXPECT_EQ(run_all(one_at_a_time->address, "one at a time"), 1u);
}

TEST(DataPathTest, MergedStepsNeverExceedTheRankCapacity) {
  // Capacity 16 tokens per rank, 2 ranks: three concurrent 13-token calls cannot share one step.
  auto service = StartServe(TwoRanksWith({"--set", "server.batch_window_us=50000", "--set",
                                          "engine.max_tokens_per_rank=16"}),
                            "dp_capacity", milliseconds(60000));
  ASSERT_TRUE(service);
  std::vector<gcmoe::v1::ForwardRequest> requests;
  for (int i = 0; i < 3; ++i) {
    RequestSpec r;
    r.num_tokens = 13;
    r.seed = 7 + i;
    requests.push_back(MakeForwardRequest(DefaultModel(), r));
  }
  std::vector<std::future<gcmoe::v1::ForwardResponse>> calls;
  for (const auto& request : requests) {
    calls.push_back(
        std::async(std::launch::async, [&] { return Forward(service->address, request); }));
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    const gcmoe::v1::ForwardResponse merged = calls[i].get();
    EXPECT_LE(merged.stats().batched_calls(), 2u);
    int tokens = 0;
    for (const auto& rank : merged.stats().ranks()) {
      EXPECT_LE(rank.tokens(), 16u);
      tokens += static_cast<int>(rank.tokens());
    }
    EXPECT_LE(tokens, 32);
    EXPECT_EQ(merged.output().data(), Forward(service->address, requests[i]).output().data());
  }
}

}  // namespace
}  // namespace gcmoe::server::testing
