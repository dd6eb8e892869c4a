// CUDA IPC, the CUDA backend's rank transport on one host (beside shm_exchange for the CPU
// backend and nccl_comm for the all-to-all baseline): each rank names its exchange region, and
// maps every peer's region into its own address space from those names.
//
// A name is "cuda-ipc:<pid>:<device>:<hex base>:<bytes>:<hex CUDA IPC handle | none>". A peer in
// the same process is reached through peer access at its base address; one in another process
// through its IPC handle ("none" when the export failed: such a rank can serve only peers in its
// own process).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace gcmoe::engine {

// The name of the exchange region [base, base + bytes) of `device` (cudaMalloc'd) for peers.
std::string CudaIpcRegionName(void* base, size_t bytes, int device);

// The peers' regions mapped into this process. Mappings opened by CUDA IPC stay open until the
// next Map, Close or destruction.
class CudaIpcPeers {
 public:
  CudaIpcPeers() = default;
  ~CudaIpcPeers() { Close(); }
  CudaIpcPeers(const CudaIpcPeers&) = delete;
  CudaIpcPeers& operator=(const CudaIpcPeers&) = delete;

  // Maps every rank's region named in `names` ([P], indexed by rank) on `device`, the calling
  // thread's current device; rank `me` is `own_base`. Every region must be `bytes` long (ranks
  // of one service agree on the model and capacity). Returns the bases indexed by rank.
  Result<std::vector<uint8_t*>> Map(const std::vector<std::string>& names, int me, int device,
                                    uint8_t* own_base, size_t bytes);
  // Closes the mappings opened by CUDA IPC.
  void Close();

 private:
  std::vector<void*> opened_;
};

}  // namespace gcmoe::engine
