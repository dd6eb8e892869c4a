// NCCL for the CUDA backend: the library, loaded at run time (so the gcmoe binary starts on
// machines without NCCL, and a CPU-only service never touches it), the per-epoch unique id the
// coordinator hands out, and one rank's communicator with the grouped send/receive rounds of
// the all-to-all baseline.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace gcmoe::engine {

// The bytes of an ncclUniqueId.
inline constexpr size_t kNcclUniqueIdBytes = 128;

// A fresh unique id (its bootstrap root lives in the calling process until every rank has
// joined); kUnavailable when NCCL cannot be loaded.
Result<std::string> NewNcclUniqueId();
// "NCCL 2.28.9", or why NCCL cannot be loaded.
std::string NcclVersionText();

// Where one grouped send/receive round puts its bytes, per peer rank q ([P] each): bytes
// [send_offset[q], + send_bytes[q]) of the send buffer go to q, and recv_bytes[q] bytes from q
// land at recv_offset[q] of the receive buffer. Zero sizes are skipped.
struct AllToAllLayout {
  std::vector<int64_t> send_offset, send_bytes, recv_offset, recv_bytes;
};

class NcclComm {
 public:
  // Joins the communicator of `unique_id` as `rank` of `world` on `device` (collective: every
  // rank calls it at about the same time, each from its own thread or process).
  static Result<std::unique_ptr<NcclComm>> Init(const std::string& unique_id, int world, int rank,
                                                int device);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // One grouped round on `stream` (a cudaStream_t), this rank's own pair included.
  Status AllToAllV(const uint8_t* send, uint8_t* recv, const AllToAllLayout& layout,
                   void* stream);
  // A peer that died leaves NCCL operations waiting forever: abandons the communicator (any
  // operation in flight fails) so that the caller's stream can drain. Thread-safe, idempotent.
  void Abort();
  bool aborted() const;
  // The communicator's asynchronous error, if any.
  Status AsyncError();

 private:
  NcclComm() = default;
  void* comm_ = nullptr;  // ncclComm_t
  std::atomic<bool> aborted_{false};
};

}  // namespace gcmoe::engine
