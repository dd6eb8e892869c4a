// Request ids on their own: which source wins, the 128-byte cap for each source, generated ids,
// and the header form of ids HTTP/2 cannot carry.
#include "server/request_id.h"

#include <set>

#include <gtest/gtest.h>

namespace gcmoe::server {
namespace {

TEST(RequestIdTest, TheFieldWinsThenTheHeaderThenAGeneratedId) {
  EXPECT_EQ(*ResolveRequestId("from-field", std::string_view("from-header")), "from-field");
  EXPECT_EQ(*ResolveRequestId("", std::string_view("from-header")), "from-header");
  std::set<std::string> generated;
  for (int i = 0; i < 100; ++i) {
    auto id = ResolveRequestId("", std::nullopt);
    ASSERT_TRUE(id.ok());
    EXPECT_EQ(id->rfind("gcmoe-", 0), 0u) << *id;
    EXPECT_LE(id->size(), kMaxRequestIdBytes);
    generated.insert(*id);
  }
  EXPECT_EQ(generated.size(), 100u) << "generated ids repeat";
  EXPECT_TRUE(ResolveRequestId("", std::string_view("")).ok());
}

TEST(RequestIdTest, IdsOver128BytesAreRefusedNamingTheirSource) {
  EXPECT_TRUE(ResolveRequestId(std::string(128, 'a'), std::nullopt).ok());
  auto field = ResolveRequestId(std::string(129, 'a'), std::nullopt);
  ASSERT_FALSE(field.ok());
  EXPECT_EQ(field.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(field.status().message(), "request_id: 129 bytes, expected at most 128");
  auto huge = ResolveRequestId(std::string(1 << 20, 'a'), std::nullopt);
  EXPECT_EQ(huge.status().message(), "request_id: 1048576 bytes, expected at most 128");
  const std::string long_header(200, 'h');
  auto header = ResolveRequestId("", std::string_view(long_header));
  ASSERT_FALSE(header.ok());
  EXPECT_EQ(header.status().message(), "x-request-id metadata: 200 bytes, expected at most 128");
}

TEST(RequestIdTest, HeaderValuesEscapeWhatHttp2CannotCarry) {
  EXPECT_EQ(RequestIdHeaderValue("plain-id_42 ok"), "plain-id_42 ok");
  EXPECT_EQ(RequestIdHeaderValue("a\nb\"c%d\x01"), "a%0Ab\"c%25d%01");
  EXPECT_EQ(RequestIdHeaderValue("\xc3\xa9"), "%C3%A9");
}

TEST(RequestIdTest, RefusedIdsAreLoggedByTheirHeadAndLength) {
  EXPECT_EQ(RefusedIdPrefix("short"), "short");
  const std::string logged = RefusedIdPrefix(std::string(1000, 'x'));
  EXPECT_EQ(logged, std::string(128, 'x') + "... (1000 bytes)");
  // Never cut inside a UTF-8 character.
  std::string accents;
  for (int i = 0; i < 100; ++i) accents += "\xc3\xa9";
  const std::string cut = RefusedIdPrefix(accents);
  EXPECT_EQ(cut.substr(0, cut.find("...")).size() % 2, 0u);
}

}  // namespace
}  // namespace gcmoe::server
