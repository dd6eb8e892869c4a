#include "engine/cuda_ipc.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

#include <cuda_runtime.h>

#include "engine/cuda_error.h"

namespace gcmoe::engine {
namespace {

struct PeerName {
  int pid = 0;
  int device = 0;
  uintptr_t base = 0;
  size_t bytes = 0;
  bool has_handle = false;
  cudaIpcMemHandle_t handle{};
};

Result<PeerName> ParsePeerName(const std::string& name) {
  PeerName peer;
  char hex[2 * sizeof(cudaIpcMemHandle_t) + 1] = {};
  unsigned long long base = 0;
  size_t bytes = 0;
  int consumed = 0;
  if (std::sscanf(name.c_str(), "cuda-ipc:%d:%d:%llx:%zu:%n", &peer.pid, &peer.device, &base,
                  &bytes, &consumed) != 4 ||
      consumed == 0) {
    return InvalidArgument("cuda backend: \"" + name.substr(0, 40) +
                           "\" is not a CUDA rank's transport name (is every rank on the cuda "
                           "backend?)");
  }
  peer.base = static_cast<uintptr_t>(base);
  peer.bytes = bytes;
  const std::string handle = name.substr(static_cast<size_t>(consumed));
  if (handle != "none") {
    if (handle.size() != 2 * sizeof(cudaIpcMemHandle_t)) {
      return InvalidArgument("cuda backend: malformed CUDA IPC handle in \"" + name + "\"");
    }
    for (size_t i = 0; i < sizeof(cudaIpcMemHandle_t); ++i) {
      hex[0] = handle[2 * i];
      hex[1] = handle[2 * i + 1];
      hex[2] = '\0';
      peer.handle.reserved[i] = static_cast<char>(std::strtoul(hex, nullptr, 16));
    }
    peer.has_handle = true;
  }
  return peer;
}

}  // namespace

std::string CudaIpcRegionName(void* base, size_t bytes, int device) {
  // A failed export only matters once a peer in another process needs the handle.
  cudaIpcMemHandle_t handle;
  std::memset(&handle, 0, sizeof(handle));
  const bool exported = cudaIpcGetMemHandle(&handle, base) == cudaSuccess;
  if (!exported) cudaGetLastError();
  std::string hex;
  char byte[3];
  for (size_t i = 0; i < sizeof(handle); ++i) {
    std::snprintf(byte, sizeof(byte), "%02x", static_cast<unsigned char>(handle.reserved[i]));
    hex += byte;
  }
  char head[160];
  std::snprintf(head, sizeof(head), "cuda-ipc:%d:%d:%llx:%zu:", static_cast<int>(getpid()), device,
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(base)), bytes);
  return std::string(head) + (exported ? hex : "none");
}

void CudaIpcPeers::Close() {
  for (void* p : opened_) cudaIpcCloseMemHandle(p);
  opened_.clear();
}

Result<std::vector<uint8_t*>> CudaIpcPeers::Map(const std::vector<std::string>& names, int me,
                                                int device, uint8_t* own_base, size_t bytes) {
  Close();
  const int world = static_cast<int>(names.size());
  std::vector<uint8_t*> bases(world, nullptr);
  for (int q = 0; q < world; ++q) {
    if (q == me) {
      bases[q] = own_base;
      continue;
    }
    GCMOE_ASSIGN_OR_RETURN(PeerName peer, ParsePeerName(names[q]));
    if (peer.bytes != bytes) {
      return FailedPrecondition("cuda backend: rank " + std::to_string(q) +
                                "'s exchange region is " + std::to_string(peer.bytes) +
                                " bytes, this rank's " + std::to_string(bytes) +
                                " (ranks with different models or capacities?)");
    }
    if (peer.pid == static_cast<int>(getpid())) {
      // A rank of this process: the address is valid here once peer access is on.
      if (peer.device != device) {
        cudaError_t err = cudaDeviceEnablePeerAccess(peer.device, 0);
        if (err == cudaErrorPeerAccessAlreadyEnabled) {
          cudaGetLastError();
          err = cudaSuccess;
        }
        if (err != cudaSuccess) {
          return CudaError("enabling peer access from device " + std::to_string(device) +
                               " to device " + std::to_string(peer.device),
                           err);
        }
      }
      bases[q] = reinterpret_cast<uint8_t*>(peer.base);
      continue;
    }
    if (!peer.has_handle) {
      return Unavailable("cuda backend: rank " + std::to_string(q) +
                         " could not export its exchange region by CUDA IPC");
    }
    void* mapped = nullptr;
    const cudaError_t err =
        cudaIpcOpenMemHandle(&mapped, peer.handle, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      return CudaError("mapping rank " + std::to_string(q) + "'s exchange region (CUDA IPC, pid " +
                           std::to_string(peer.pid) + ", device " + std::to_string(peer.device) +
                           ")",
                       err);
    }
    opened_.push_back(mapped);
    bases[q] = static_cast<uint8_t*>(mapped);
  }
  return bases;
}

}  // namespace gcmoe::engine
