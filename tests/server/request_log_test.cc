// Request ids and the log as a client meets them: ids from the field or the x-request-id
// metadata (or generated) come back in the response and its metadata; ids over 128 bytes are
// refused; with logging.format "json" every line the service writes is one valid JSON object,
// whatever the ids hold, with the id intact; failures beyond logging.failures_per_interval are
// summarized by code.
#include <signal.h>

#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/request_id.h"
#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

struct Call {
  grpc::Status status;
  gcmoe::v1::ForwardResponse response;
  std::string header;  // x-request-id of the response's metadata
};

Call Forward(gcmoe::v1::MoeService::Stub* stub, gcmoe::v1::ForwardRequest request,
             const std::string& metadata_id = "") {
  Call call;
  grpc::ClientContext context;
  if (!metadata_id.empty()) context.AddMetadata("x-request-id", metadata_id);
  call.status = stub->Forward(&context, request, &call.response);
  const auto& metadata = context.GetServerInitialMetadata();
  const auto found = metadata.find("x-request-id");
  if (found != metadata.end()) call.header.assign(found->second.data(), found->second.size());
  return call;
}

gcmoe::v1::ForwardRequest Request(const std::string& id, int layer = 0) {
  RequestSpec r;
  r.num_tokens = 4;
  r.layer = layer;
  gcmoe::v1::ForwardRequest request = MakeForwardRequest(DefaultModel(), r);
  request.set_request_id(id);
  return request;
}

TEST(RequestLogTest, IdsComeBackAndEveryJsonLogLineStaysValid) {
  auto s =
      StartServe({"--set", "logging.format=json", "--set", "logging.level=debug", "--set",
                  "logging.failures_per_interval=5", "--set", "logging.failure_interval_ms=60000"},
                 "request-log", milliseconds(60000));
  ASSERT_TRUE(s.has_value());
  auto stub = Connect(s->address);

  // Quotes, a newline, control characters and a whole forged record.
  const std::string nasty =
      "id \"quoted\" \\ back\x01\x1f\n{\"level\":\"error\",\"msg\":\"forged record\"}";
  ASSERT_LE(nasty.size(), kMaxRequestIdBytes);
  const Call failed = Forward(stub.get(), Request(nasty, 99));  // no layer 99: NOT_FOUND
  EXPECT_EQ(failed.status.error_code(), grpc::StatusCode::NOT_FOUND);
  const Call ok = Forward(stub.get(), Request(nasty));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.response.request_id(), nasty);
  EXPECT_EQ(ok.header, RequestIdHeaderValue(nasty));

  const Call from_metadata = Forward(stub.get(), Request(""), "meta-id-7");
  ASSERT_TRUE(from_metadata.status.ok());
  EXPECT_EQ(from_metadata.response.request_id(), "meta-id-7");
  EXPECT_EQ(from_metadata.header, "meta-id-7");

  const Call generated = Forward(stub.get(), Request(""));
  ASSERT_TRUE(generated.status.ok());
  EXPECT_EQ(generated.response.request_id().rfind("gcmoe-", 0), 0u)
      << generated.response.request_id();
  EXPECT_EQ(generated.header, generated.response.request_id());

  const Call long_field = Forward(stub.get(), Request(std::string(129, 'x')));
  EXPECT_EQ(long_field.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(long_field.status.error_message(), "request_id: 129 bytes, expected at most 128");
  const Call huge_field = Forward(stub.get(), Request(std::string(1 << 20, 'x')));
  EXPECT_EQ(huge_field.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const Call long_header = Forward(stub.get(), Request(""), std::string(200, 'm'));
  EXPECT_EQ(long_header.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(long_header.status.error_message().find("x-request-id metadata: 200 bytes"),
            std::string::npos);

  // A burst of failures: five logged whole (three so far), the rest counted.
  for (int i = 0; i < 20; ++i) Forward(stub.get(), Request("burst-" + std::to_string(i), 99));

  s->process->Signal(SIGTERM);
  ASSERT_TRUE(s->process->Wait(milliseconds(15000)).has_value());
  std::istringstream log(s->process->Log());
  int records = 0;
  bool nasty_intact = false;
  int burst_lines = 0;
  bool summary = false;
  // gRPC's own stderr lines ("E1204 ..."), not ours. No <regex>: GCC 12 warns inside it under
  // the sanitizers, and the build treats warnings as errors.
  auto grpc_line = [](const std::string& line) {
    if (line.size() < 6 || std::string("DIEW").find(line[0]) == std::string::npos) return false;
    for (int i = 1; i <= 4; ++i) {
      if (line[i] < '0' || line[i] > '9') return false;
    }
    return line[5] == ' ';
  };
  for (std::string line; std::getline(log, line);) {
    if (grpc_line(line)) {
      EXPECT_EQ(line.find("forged"), std::string::npos) << line;
      continue;
    }
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(record.is_discarded()) << "not a JSON record: " << line;
    ASSERT_TRUE(record.contains("msg") && record.contains("level")) << line;
    EXPECT_TRUE(record["level"] == "trace" || record["level"] == "debug" ||
                record["level"] == "info" || record["level"] == "warn" ||
                record["level"] == "error")
        << line;
    ++records;
    const std::string msg = record["msg"];
    if (msg.find(nasty) != std::string::npos) nasty_intact = true;
    if (msg.find("\"burst-") != std::string::npos) ++burst_lines;
    if (msg.find("more failed call(s)") != std::string::npos) {
      summary = true;
      EXPECT_NE(msg.find("NOT_FOUND"), std::string::npos) << msg;
    }
  }
  EXPECT_GT(records, 10);
  EXPECT_TRUE(nasty_intact) << s->process->Log();
  EXPECT_LE(burst_lines, 5) << s->process->Log();
  EXPECT_TRUE(summary) << "the pending summary is written at shutdown:\n" << s->process->Log();
}

}  // namespace
}  // namespace gcmoe::server::testing
