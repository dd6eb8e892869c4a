#include "server/auth_tokens.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string_view>

namespace gcmoe::server {
namespace {

constexpr std::string_view kBearer = "Bearer ";

std::string Trim(const std::string& s) {
  const char* space = " \t\r\n";
  const size_t begin = s.find_first_not_of(space);
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(space) - begin + 1);
}

// Compares in time that depends on the lengths only, so a caller cannot learn a token's
// prefix from how long a refusal takes.
bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

}  // namespace

Result<std::vector<std::string>> ReadTokensFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return InvalidArgument("server.auth.tokens_file: cannot read " + path + ": " +
                           std::strerror(errno));
  }
  std::vector<std::string> tokens;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string token = Trim(line);
    if (token.empty() || token[0] == '#') continue;
    if (token.find_first_of(" \t") != std::string::npos) {
      return InvalidArgument("server.auth.tokens_file: " + path + " line " +
                             std::to_string(number) +
                             ": expected one token per line, got a line with spaces");
    }
    tokens.push_back(token);
  }
  if (in.bad()) return InvalidArgument("server.auth.tokens_file: error reading " + path);
  if (tokens.empty()) {
    return InvalidArgument("server.auth.tokens_file: " + path +
                           " holds no token (one per line; '#' starts a comment)");
  }
  return tokens;
}

Result<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::Load(const std::string& path) {
  std::unique_ptr<TokenAuthenticator> auth(new TokenAuthenticator());
  auth->path_ = path;
  GCMOE_RETURN_IF_ERROR(auth->Reload());
  return auth;
}

Status TokenAuthenticator::Reload() {
  GCMOE_ASSIGN_OR_RETURN(std::vector<std::string> tokens, ReadTokensFile(path_));
  std::lock_guard<std::mutex> lock(mu_);
  tokens_ = std::move(tokens);
  return Status::Ok();
}

size_t TokenAuthenticator::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tokens_.size();
}

std::string BearerToken(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  if (found == metadata.end()) return "";
  const std::string_view value(found->second.data(), found->second.size());
  if (value.substr(0, kBearer.size()) != kBearer) return "";
  return std::string(value.substr(kBearer.size()));
}

grpc::Status TokenAuthenticator::Check(const grpc::ServerContext& context) const {
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  if (found == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "no \"authorization: Bearer TOKEN\" metadata (server.auth.tokens_file "
                        "is set)");
  }
  const std::string_view value(found->second.data(), found->second.size());
  if (value.substr(0, kBearer.size()) != kBearer) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the authorization metadata is not \"Bearer TOKEN\"");
  }
  const std::string_view token = value.substr(kBearer.size());
  bool match = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Every token is compared, so the time does not say which one matched.
    for (const std::string& t : tokens_) match |= ConstantTimeEqual(token, t);
  }
  if (!match) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the bearer token is not one of server.auth.tokens_file's");
  }
  return grpc::Status::OK;
}

}  // namespace gcmoe::server
