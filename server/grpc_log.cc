#include "server/grpc_log.h"

#include <cstdlib>
#include <string_view>

#include <grpc/support/log.h>
#include <spdlog/spdlog.h>

namespace gcmoe::server {

namespace {

// gRPC's POSIX TCP server closes every connection it accepts while its resource quota reports
// high memory pressure, and says so only at its info level.
constexpr std::string_view kDroppedConnection = "Drop incoming connection: high memory pressure";

void OnGrpcLog(gpr_log_func_args* args) {
  const std::string_view message =
      args->message != nullptr ? std::string_view(args->message) : std::string_view();
  if (args->severity == GPR_LOG_SEVERITY_ERROR) {
    spdlog::error("grpc: {}", message);
  } else if (message.substr(0, kDroppedConnection.size()) == kDroppedConnection) {
    spdlog::warn(
        "grpc: dropped an incoming connection: the port's memory quota is nearly full (the public "
        "port's is server.receive_quota_bytes); its client gets UNAVAILABLE");
  } else {
    spdlog::debug("grpc: {}", message);
  }
}

}  // namespace

void RouteGrpcLogToSpdlog() {
  gpr_set_log_function(OnGrpcLog);
  // Info, not gRPC's default of errors only: the dropped connection is an info line. gRPC logs
  // at info on connection events, not per call. An operator's GRPC_VERBOSITY (gRPC's own
  // variable, e.g. with GRPC_TRACE) still decides; its info lines show at logging.level debug.
  if (std::getenv("GRPC_VERBOSITY") == nullptr) gpr_set_log_verbosity(GPR_LOG_SEVERITY_INFO);
}

}  // namespace gcmoe::server
