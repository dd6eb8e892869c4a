// gRPC's own log lines in the process's log: one format (text or JSON, logging.format) and one
// destination (logging.file) for everything the process says.
#pragma once

namespace gcmoe::server {

// Routes gRPC's log (gpr_log) through the default spdlog logger, process-wide: gRPC's errors as
// errors, its info lines as debug, "grpc: " before each. One info line is a warning: a server
// that drops the connections it accepts while its memory quota is nearly full (its clients see
// UNAVAILABLE at once and nothing else would say why). gRPC's verbosity becomes info unless
// GRPC_VERBOSITY sets it. Call after SetupLogging's logger exists.
void RouteGrpcLogToSpdlog();

}  // namespace gcmoe::server
