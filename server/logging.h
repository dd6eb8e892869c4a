// Process-wide logging set up from the config's logging section.
#pragma once

#include <string>

#include "common/status.h"
#include "config/config.h"

namespace gcmoe::server {

// role names the process in every line: "coordinator", "rank 1", "serve".
Status SetupLogging(const config::LoggingConfig& logging, const std::string& role);

}  // namespace gcmoe::server
