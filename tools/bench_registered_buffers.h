// `gcmoe bench serve --modes registered`: what a co-located frontend's Forward costs when its
// tensors live in registered shared memory instead of crossing gRPC. One POSIX shared-memory
// object holds each benchmark request's inputs (written once, as a frontend's would already be
// there) and one output area per caller; it is registered with the service for the run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "gcmoe/v1/moe.grpc.pb.h"

namespace gcmoe::tools {

class RegisteredBuffers {
 public:
  // Creates the object, copies every request's tensors into it and registers it; the service
  // must run with server.allow_registered_memory on.
  static Result<std::unique_ptr<RegisteredBuffers>> Create(
      gcmoe::v1::MoeService::Stub* stub, const std::vector<gcmoe::v1::ForwardRequest>& requests,
      int callers, int64_t output_bytes, int timeout_ms);
  // Unregisters, unmaps and removes the object.
  ~RegisteredBuffers();

  // Request `index` with its tensors named in the region, and caller `caller`'s output area.
  const gcmoe::v1::ForwardRequest& request(int caller, int index) const {
    return requests_[static_cast<size_t>(caller) * variants_ + index];
  }

 private:
  RegisteredBuffers() = default;

  gcmoe::v1::MoeService::Stub* stub_ = nullptr;
  int timeout_ms_ = 0;
  std::string key_;
  std::string name_;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  bool registered_ = false;
  size_t variants_ = 0;
  std::vector<gcmoe::v1::ForwardRequest> requests_;  // [callers][variants]
};

}  // namespace gcmoe::tools
