#include "server/log_format.h"

#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace gcmoe::server {
namespace {

// "2026-12-04T13:40:17.123+0000" (ISO 8601, local time with its offset).
std::string IsoTime(spdlog::log_clock::time_point time) {
  const auto since_epoch = time.time_since_epoch();
  const time_t seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count();
  const int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count() % 1000);
  struct tm local {};
  localtime_r(&seconds, &local);
  char date[32];
  char zone[8];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &local);
  std::strftime(zone, sizeof(zone), "%z", &local);
  char out[48];
  std::snprintf(out, sizeof(out), "%s.%03d%s", date, millis, zone);
  return out;
}

class JsonFormatter final : public spdlog::formatter {
 public:
  explicit JsonFormatter(std::string role) : role_(std::move(role)), pid_(getpid()) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    nlohmann::ordered_json line = nlohmann::ordered_json::object();
    line["time"] = IsoTime(msg.time);
    line["level"] = LevelName(msg.level);
    line["role"] = role_;
    line["pid"] = pid_;
    line["msg"] = std::string(msg.payload.data(), msg.payload.size());
    // Bytes that are not UTF-8 become U+FFFD instead of throwing: a log line is never lost.
    const std::string text =
        line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    dest.append(text.data(), text.data() + text.size());
    dest.push_back('\n');
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>(role_);
  }

 private:
  const std::string role_;
  const int pid_;
};

class TextFormatter final : public spdlog::formatter {
 public:
  explicit TextFormatter(std::string role) : role_(std::move(role)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    std::string head = "[" + IsoTime(msg.time) + "] [" + role_ + "] [";
    head.replace(11, 1, " ");  // "2026-12-04 13:40:17.123+0000": the date and time read apart
    dest.append(head.data(), head.data() + head.size());
    const char* level = LevelName(msg.level);
    msg.color_range_start = dest.size();
    dest.append(level, level + std::char_traits<char>::length(level));
    msg.color_range_end = dest.size();
    dest.append(std::string_view("] "));
    // A newline or another control character in a message (a client's request id) would start
    // what looks like a record of its own: write it as an escape instead.
    for (const char c : std::string_view(msg.payload.data(), msg.payload.size())) {
      const auto u = static_cast<unsigned char>(c);
      if (u >= 0x20 && u != 0x7F) {
        dest.push_back(c);
      } else if (c == '\n') {
        dest.append(std::string_view("\\n"));
      } else if (c == '\t') {
        dest.append(std::string_view("\\t"));
      } else {
        char escaped[8];
        std::snprintf(escaped, sizeof(escaped), "\\x%02x", u);
        dest.append(escaped, escaped + 4);
      }
    }
    dest.push_back('\n');
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<TextFormatter>(role_);
  }

 private:
  const std::string role_;
};

}  // namespace

const char* LevelName(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
      return "trace";
    case spdlog::level::debug:
      return "debug";
    case spdlog::level::info:
      return "info";
    case spdlog::level::warn:
      return "warn";
    case spdlog::level::err:
      return "error";
    case spdlog::level::critical:
      return "critical";
    default:
      return "off";
  }
}

std::unique_ptr<spdlog::formatter> MakeLogFormatter(const std::string& format,
                                                    const std::string& role) {
  if (format == "json") return std::make_unique<JsonFormatter>(role);
  return std::make_unique<TextFormatter>(role);
}

}  // namespace gcmoe::server
