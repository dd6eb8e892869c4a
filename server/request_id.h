// A Forward call's request id: the client's (the request_id field, else the x-request-id
// metadata), or one the service makes up, so that every call can be found in the logs and the
// client can match them to its own.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace gcmoe::server {

// Longer ids are refused: an id is logged with every line about its call.
inline constexpr size_t kMaxRequestIdBytes = 128;
inline constexpr char kRequestIdHeader[] = "x-request-id";

// The request_id field when set, else the x-request-id header when sent, else a new id
// ("gcmoe-" and 16 hex digits, unique within the process). INVALID_ARGUMENT naming the field when
// the one chosen is over kMaxRequestIdBytes.
Result<std::string> ResolveRequestId(const std::string& field,
                                     std::optional<std::string_view> header);

// The id as an HTTP/2 header value may carry it (printable ASCII): bytes outside 0x20..0x7E and
// '%' itself become %XX, so the x-request-id the client gets back is always sendable.
std::string RequestIdHeaderValue(const std::string& id);

// The first kMaxRequestIdBytes bytes of an id that was refused, for its log line.
std::string RefusedIdPrefix(std::string_view id);

}  // namespace gcmoe::server
