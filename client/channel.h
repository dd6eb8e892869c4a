// The client's channel to the service and how it words RPC failures.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/flags.h"
#include "common/status.h"

namespace gcmoe::client {

// Responses carry [T, H] outputs far past gRPC's 4 MiB default; the channel accepts up to this
// much unless the server announces a larger limit (ModelInfo.max_message_bytes).
inline constexpr int kDefaultMaxMessageBytes = 256 << 20;

// How to reach a service that has TLS (server.tls) or tokens (server.auth.tokens_file) on.
struct ConnectionOptions {
  bool tls = false;      // TLS, verifying the server against the system's CAs or tls_ca
  std::string tls_ca;    // PEM CA bundle that signed the server's certificate (implies tls)
  std::string tls_cert;  // client certificate (PEM) for mTLS, with tls_key
  std::string tls_key;
  // The name the server's certificate must carry when it differs from the address's host
  // (a probe dialling 127.0.0.1 of a service whose certificate names its DNS name).
  std::string tls_server_name;
  std::string token_file;  // file whose first non-comment line is the bearer token
};

// --tls, --tls-ca, --tls-cert, --tls-key, --tls-server-name, --token-file.
void AddConnectionFlags(Flags* flags, ConnectionOptions* options);

// A channel that speaks TLS when asked and sends "authorization: Bearer TOKEN" on every call
// when a token file is given. An unreadable file is INVALID_ARGUMENT naming its flag.
Result<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& addr, int max_message_bytes,
                                                   const ConnectionOptions& options);
// Plaintext, no token. gRPC shares one connection among the channels a process opens to the
// same address; with own_connection a channel opens its own.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& addr, int max_message_bytes,
                                           bool own_connection = false);

// A deadline `ms` from now, for ClientContext::set_deadline.
inline std::chrono::system_clock::time_point DeadlineIn(int ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

// "INVALID_ARGUMENT", "UNAVAILABLE", ...
std::string GrpcCodeName(grpc::StatusCode code);

// True when the call failed because no connection could be made, not because the service
// answered with an error (the coordinator itself answers UNAVAILABLE while ranks are down).
bool IsUnreachable(grpc::Channel* channel, const grpc::Status& status);

// "cannot reach ADDR: <reason>" or "RPC on ADDR failed: CODE: message".
std::string DescribeFailure(const std::string& addr, const std::string& rpc, grpc::Channel* channel,
                            const grpc::Status& status);

}  // namespace gcmoe::client
