// The client's channel to the service and how it words RPC failures.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

namespace gcmoe::client {

// Responses carry [T, H] outputs far past gRPC's 4 MiB default; the channel accepts up to this
// much unless the server announces a larger limit (ModelInfo.max_message_bytes).
inline constexpr int kDefaultMaxMessageBytes = 256 << 20;

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& addr, int max_message_bytes);

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
