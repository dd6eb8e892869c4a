// gRPC's own log lines reach the process's logger: errors as errors, the line a server writes
// when it drops the connections it accepts under memory pressure as a warning that names the
// quota, everything else it says at info as debug; each through gRPC's real gpr_log.
#include "server/grpc_log.h"

#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>

#include <grpc/support/log.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

namespace gcmoe::server {
namespace {

class GrpcLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out_);
    auto logger = std::make_shared<spdlog::logger>("grpc-log-test", sink);
    logger->set_pattern("%l %v");
    logger->set_level(spdlog::level::debug);
    previous_ = spdlog::default_logger();
    spdlog::set_default_logger(logger);
    RouteGrpcLogToSpdlog();
  }
  void TearDown() override { spdlog::set_default_logger(previous_); }

  std::string Logged() {
    spdlog::default_logger()->flush();
    return out_.str();
  }

  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST_F(GrpcLogTest, ErrorsAreErrors) {
  gpr_log(GPR_ERROR, "bind failed: %s", "Address already in use");
  EXPECT_EQ(Logged(), "error grpc: bind failed: Address already in use\n");
}

TEST_F(GrpcLogTest, ADroppedConnectionIsAWarningThatNamesTheQuota) {
  gpr_log(GPR_INFO, "Drop incoming connection: high memory pressure");
  const std::string logged = Logged();
  EXPECT_EQ(logged.rfind("warning grpc: dropped an incoming connection", 0), 0u) << logged;
  EXPECT_NE(logged.find("server.receive_quota_bytes"), std::string::npos) << logged;
  EXPECT_NE(logged.find("UNAVAILABLE"), std::string::npos) << logged;
}

TEST_F(GrpcLogTest, OtherInfoLinesAreDebugAndHiddenAboveIt) {
  gpr_log(GPR_INFO, "Failed to add :: listener");
  EXPECT_EQ(Logged(), "debug grpc: Failed to add :: listener\n");
  spdlog::default_logger()->set_level(spdlog::level::info);
  gpr_log(GPR_INFO, "another info line");
  EXPECT_EQ(Logged(), "debug grpc: Failed to add :: listener\n");
}

TEST_F(GrpcLogTest, DebugLinesStayBelowGrpcsVerbosity) {
  gpr_log(GPR_DEBUG, "a debug line");
  EXPECT_EQ(Logged(), "");
}

// GRPC_VERBOSITY is gRPC's own setting, which it reads into its verbosity: it stays in force.
TEST_F(GrpcLogTest, GrpcVerbosityStillDecides) {
  setenv("GRPC_VERBOSITY", "ERROR", 1);
  gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);  // what gRPC makes of it
  RouteGrpcLogToSpdlog();
  gpr_log(GPR_INFO, "an info line");
  gpr_log(GPR_ERROR, "an error");
  unsetenv("GRPC_VERBOSITY");
  RouteGrpcLogToSpdlog();  // back to info for the tests after this one in the same process
  EXPECT_EQ(Logged(), "error grpc: an error\n");
}

}  // namespace
}  // namespace gcmoe::server
