// Log lines on their own: in JSON every record is one valid object whatever its message holds
// (quotes, newlines, control characters, a whole forged record, bytes that are not UTF-8), with
// the message intact; in text a message cannot start a line of its own. Level names are spelled
// as logging.level spells them.
#include "server/log_format.h"

#include <sstream>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

namespace gcmoe::server {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

constexpr char kControls[] = "nul \0 bell \x07 escape \x1b[31m del \x7f";

const std::vector<std::string>& NastyMessages() {
  static const std::vector<std::string> messages = {
      "plain",
      "quote \" and backslash \\ and \\\" together",
      "new\nline and \r carriage return and \t tab",
      std::string(kControls, sizeof(kControls) - 1),
      "}\n{\"time\":\"2026-01-01T00:00:00.000+0000\",\"level\":\"error\",\"msg\":\"forged\"}",
      "unicode é ✓ 𝄞",
  };
  return messages;
}

TEST(LogFormatTest, EveryJsonLineParsesAndKeepsItsMessageIntact) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  spdlog::logger logger("json-test", sink);
  logger.set_formatter(MakeLogFormatter("json", "coordinator"));
  logger.set_level(spdlog::level::trace);
  for (const std::string& message : NastyMessages()) logger.warn("{}", message);
  const std::vector<std::string> lines = Lines(out.str());
  ASSERT_EQ(lines.size(), NastyMessages().size()) << out.str();
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json record = nlohmann::json::parse(lines[i], nullptr, false);
    ASSERT_FALSE(record.is_discarded()) << "not JSON: " << lines[i];
    EXPECT_EQ(record["msg"], NastyMessages()[i]);
    EXPECT_EQ(record["level"], "warn");
    EXPECT_EQ(record["role"], "coordinator");
    EXPECT_TRUE(record["pid"].is_number_integer());
    EXPECT_EQ(record["time"].get<std::string>().size(), 28u) << record["time"];
  }
}

TEST(LogFormatTest, BytesThatAreNotUtf8StillMakeAValidJsonLine) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  spdlog::logger logger("json-bytes", sink);
  logger.set_formatter(MakeLogFormatter("json", "rank 0"));
  logger.info("{}", std::string("bad \xff\xfe utf-8"));
  const nlohmann::json record = nlohmann::json::parse(Lines(out.str()).at(0), nullptr, false);
  ASSERT_FALSE(record.is_discarded()) << out.str();
  EXPECT_EQ(record["msg"], "bad \xef\xbf\xbd\xef\xbf\xbd utf-8");
}

TEST(LogFormatTest, TextLinesEscapeControlCharacters) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  spdlog::logger logger("text-test", sink);
  logger.set_formatter(MakeLogFormatter("text", "serve"));
  for (const std::string& message : NastyMessages()) logger.error("{}", message);
  const std::vector<std::string> lines = Lines(out.str());
  ASSERT_EQ(lines.size(), NastyMessages().size()) << out.str();
  EXPECT_NE(lines[2].find("new\\nline and \\x0d carriage return and \\t tab"), std::string::npos)
      << lines[2];
  EXPECT_NE(lines[4].find("}\\n{\"time\""), std::string::npos) << lines[4];
  for (const std::string& line : lines) {
    EXPECT_EQ(line.rfind("[", 0), 0u) << line;
    EXPECT_NE(line.find("] [serve] [error] "), std::string::npos) << line;
  }
}

TEST(LogFormatTest, LevelNamesAreTheConfigsSpelling) {
  EXPECT_STREQ(LevelName(spdlog::level::trace), "trace");
  EXPECT_STREQ(LevelName(spdlog::level::debug), "debug");
  EXPECT_STREQ(LevelName(spdlog::level::info), "info");
  EXPECT_STREQ(LevelName(spdlog::level::warn), "warn");
  EXPECT_STREQ(LevelName(spdlog::level::err), "error");
}

}  // namespace
}  // namespace gcmoe::server
