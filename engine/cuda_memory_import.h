// Another process's GPU memory, exported with cudaIpcGetMemHandle, opened in a rank of the CUDA
// backend (Backend::ImportDeviceMemory): what RegisterMemory's cuda_ipc registrations become on
// each rank, so that a co-located frontend's activations and outputs move from GPU to GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "engine/backend.h"

namespace gcmoe::engine {

// Opens `ipc_handle` on `current_device` (the calling thread's, the rank's GPU; peer access is
// enabled when the allocation is on another GPU) and checks that the allocation is on `device`
// and holds [offset, offset + bytes). Errors name the registration's fields (cuda_ipc.*).
Result<std::shared_ptr<ImportedMemory>> ImportCudaIpcMemory(const std::string& ipc_handle,
                                                            int device, uint64_t offset,
                                                            uint64_t bytes, int current_device);

}  // namespace gcmoe::engine
