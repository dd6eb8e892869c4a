// `gcmoe bench serve --modes registered,gpu`: what a co-located frontend's Forward costs when its
// tensors live in registered memory instead of crossing gRPC. `registered`: one POSIX
// shared-memory object holds each benchmark request's inputs (written once, as a frontend's
// would already be there) and one output area per caller. `gpu`: one CUDA allocation of this
// process (a cuda_ipc registration) holds each request's activations and each caller's output
// area, and the routing stays inline, as the service requires. Either is registered with the
// service for the run.
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
  enum class Memory { kPosixShm, kGpu };
  // Creates the memory, copies every request's tensors into it and registers it; the service
  // must run with server.allow_registered_memory on (and the cuda backend for kGpu, which takes
  // BF16 or FP32 activations).
  static Result<std::unique_ptr<RegisteredBuffers>> Create(
      gcmoe::v1::MoeService::Stub* stub, const std::vector<gcmoe::v1::ForwardRequest>& requests,
      int callers, int64_t output_bytes, int timeout_ms, Memory memory = Memory::kPosixShm);
  // Unregisters, unmaps and removes the object, or frees the GPU memory.
  ~RegisteredBuffers();

  // Request `index` with its tensors named in the region, and caller `caller`'s output area.
  const gcmoe::v1::ForwardRequest& request(int caller, int index) const {
    return requests_[static_cast<size_t>(caller) * variants_ + index];
  }

 private:
  RegisteredBuffers() = default;
  // requests_: `in_region` once per caller, each caller's output area [output_bytes] in turn
  // from `offset` on.
  void AddCallers(const std::vector<gcmoe::v1::ForwardRequest>& in_region, int callers,
                  int64_t output_bytes, size_t offset);
  friend Result<std::unique_ptr<RegisteredBuffers>> CreateOnGpu(
      std::unique_ptr<RegisteredBuffers> b, const std::vector<gcmoe::v1::ForwardRequest>& requests,
      int callers, int64_t output_bytes);

  gcmoe::v1::MoeService::Stub* stub_ = nullptr;
  int timeout_ms_ = 0;
  std::string key_;
  std::string name_;
  uint8_t* data_ = nullptr;  // the mapping, or the device allocation with kGpu
  size_t bytes_ = 0;
  Memory memory_ = Memory::kPosixShm;
  bool registered_ = false;
  size_t variants_ = 0;
  std::vector<gcmoe::v1::ForwardRequest> requests_;  // [callers][variants]
};

}  // namespace gcmoe::tools
