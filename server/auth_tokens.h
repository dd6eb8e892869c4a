// Bearer-token authentication of the public API (server.auth.tokens_file).
//
// A call carries "authorization: Bearer TOKEN" metadata; a call without it, or with a token not
// in the file, is UNAUTHENTICATED. The file holds one token per line; blank lines and lines
// starting with '#' are skipped, so tokens can be rotated by adding the new one, reloading
// (SIGHUP), moving clients, then removing the old one.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include "common/status.h"

namespace gcmoe::server {

class TokenAuthenticator {
 public:
  // INVALID_ARGUMENT naming server.auth.tokens_file when the file cannot be read or holds no
  // token.
  static Result<std::unique_ptr<TokenAuthenticator>> Load(const std::string& path);

  // Reads the file again; on an error the current tokens stay.
  Status Reload();
  size_t size() const;

  // OK, or UNAUTHENTICATED saying what was missing or wrong (never echoing the token).
  grpc::Status Check(const grpc::ServerContext& context) const;

 private:
  TokenAuthenticator() = default;

  std::string path_;
  mutable std::mutex mu_;
  std::vector<std::string> tokens_;
};

// The bearer token a call presents ("" without one): the identity registered memory is scoped
// to (server/memory_registry.h). Meaningful once Check has accepted the call.
std::string BearerToken(const grpc::ServerContext& context);

// The tokens of a tokens file, in order (exposed for tests).
Result<std::vector<std::string>> ReadTokensFile(const std::string& path);

}  // namespace gcmoe::server
