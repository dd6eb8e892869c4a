// The one place a gcmoe Status becomes a grpc::Status (the RPC edge).
#pragma once

#include <grpcpp/support/status.h>

#include "common/status.h"

namespace gcmoe::server {

grpc::StatusCode ToGrpcCode(StatusCode code);
StatusCode FromGrpcCode(grpc::StatusCode code);
grpc::Status ToGrpcStatus(const Status& status);

}  // namespace gcmoe::server
