#include "server/logging.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "server/grpc_log.h"
#include "server/log_format.h"

namespace gcmoe::server {

Status SetupLogging(const config::LoggingConfig& logging, const std::string& role) {
  const spdlog::level::level_enum level = spdlog::level::from_str(logging.level);
  if (logging.level != LevelName(level)) {
    return InvalidArgument("logging.level: \"" + logging.level +
                           "\", expected trace, debug, info, warn or error");
  }
  std::shared_ptr<spdlog::logger> logger;
  try {
    if (logging.file.empty()) {
      logger = spdlog::stderr_color_mt("gcmoe-" + role);
    } else {
      logger = spdlog::basic_logger_mt("gcmoe-" + role, logging.file);
    }
  } catch (const spdlog::spdlog_ex& e) {
    return InvalidArgument("logging.file: cannot open \"" + logging.file + "\": " + e.what());
  }
  logger->set_formatter(MakeLogFormatter(logging.format, role));
  logger->set_level(level);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  RouteGrpcLogToSpdlog();
  return Status::Ok();
}

}  // namespace gcmoe::server
