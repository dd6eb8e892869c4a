// How each log line reads (logging.format): "text", one line per record with control characters
// escaped, or "json", one object per line built with nlohmann/json so that every field is
// escaped and no message (a request id with quotes, newlines or a whole fake record in it) can
// break a line or forge another. Level names are spelled as logging.level spells them.
#pragma once

#include <memory>
#include <string>

#include <spdlog/formatter.h>

namespace gcmoe::server {

// "trace", "debug", "info", "warn", "error", "critical".
const char* LevelName(spdlog::level::level_enum level);

// format is "text" or "json"; role names the process in every line ("coordinator", "rank 1").
std::unique_ptr<spdlog::formatter> MakeLogFormatter(const std::string& format,
                                                    const std::string& role);

}  // namespace gcmoe::server
