// libFuzzer target: the config loader (config/config.h) on arbitrary text, as `--config FILE`
// hands it over. An accepted config must survive the trip through `config show`: its canonical
// JSON parses again to the same canonical JSON and the same digest (the digest is what ranks and
// coordinator compare, so a config that printed differently from what it meant would split them).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "config/config.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "config_fuzz: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto parsed = gcmoe::config::ParseConfig(text, "<fuzz>");
  if (!parsed.ok()) {
    if (parsed.status().code() != gcmoe::StatusCode::kInvalidArgument) {
      Fail("a bad config is not INVALID_ARGUMENT: " + parsed.status().ToString());
    }
    if (parsed.status().message().empty()) Fail("a refusal without a message");
    return 0;
  }
  const gcmoe::config::Config& config = parsed.value();
  const std::string canonical = config.ToJson();
  auto again = gcmoe::config::ParseConfig(canonical, "<canonical>");
  if (!again.ok()) Fail("the canonical JSON does not parse: " + again.status().ToString());
  if (again.value().ToJson() != canonical) Fail("the canonical JSON changes on a second trip");
  if (again.value().Digest() != config.Digest()) Fail("the digest changes on a second trip");
  return 0;
}
