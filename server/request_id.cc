#include "server/request_id.h"

#include <atomic>
#include <cstdio>
#include <random>

namespace gcmoe::server {
namespace {

// A random per-process prefix keeps ids of two service lives (or two coordinators) apart; the
// counter keeps them apart within one.
std::string NewRequestId() {
  static const uint32_t process_tag = std::random_device{}();
  static std::atomic<uint64_t> counter{0};
  char id[32];
  std::snprintf(id, sizeof(id), "gcmoe-%08x%08llx", process_tag,
                static_cast<unsigned long long>(counter.fetch_add(1) + 1));
  return id;
}

}  // namespace

Result<std::string> ResolveRequestId(const std::string& field,
                                     std::optional<std::string_view> header) {
  if (!field.empty()) {
    if (field.size() > kMaxRequestIdBytes) {
      return InvalidArgument("request_id: " + std::to_string(field.size()) +
                             " bytes, expected at most " + std::to_string(kMaxRequestIdBytes));
    }
    return field;
  }
  if (header.has_value() && !header->empty()) {
    if (header->size() > kMaxRequestIdBytes) {
      return InvalidArgument(std::string(kRequestIdHeader) +
                             " metadata: " + std::to_string(header->size()) +
                             " bytes, expected at most " + std::to_string(kMaxRequestIdBytes));
    }
    return std::string(*header);
  }
  return NewRequestId();
}

std::string RequestIdHeaderValue(const std::string& id) {
  std::string out;
  out.reserve(id.size());
  for (const unsigned char c : id) {
    if (c >= 0x20 && c <= 0x7E && c != '%') {
      out += static_cast<char>(c);
    } else {
      char escaped[4];
      std::snprintf(escaped, sizeof(escaped), "%%%02X", c);
      out += escaped;
    }
  }
  return out;
}

std::string RefusedIdPrefix(std::string_view id) {
  if (id.size() <= kMaxRequestIdBytes) return std::string(id);
  // Cut at a UTF-8 character boundary so the prefix stays valid text.
  size_t end = kMaxRequestIdBytes;
  while (end > 0 && (static_cast<unsigned char>(id[end]) & 0xC0) == 0x80) --end;
  return std::string(id.substr(0, end)) + "... (" + std::to_string(id.size()) + " bytes)";
}

}  // namespace gcmoe::server
