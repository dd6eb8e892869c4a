#include "engine/cuda_memory_import.h"

#include <cstring>

#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/driver_entry.h"

namespace gcmoe::engine {
namespace {

class CudaImportedMemory final : public ImportedMemory {
 public:
  CudaImportedMemory(void* base, int device) : base_(base), device_(device) {}
  ~CudaImportedMemory() override {
    // The holder may be any thread: close on the device the mapping was opened on.
    if (cudaSetDevice(device_) == cudaSuccess) cudaIpcCloseMemHandle(base_);
  }

 private:
  void* base_;
  int device_;
};

std::string ErrorText(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

}  // namespace

Result<std::shared_ptr<ImportedMemory>> ImportCudaIpcMemory(const std::string& ipc_handle,
                                                            int device, uint64_t offset,
                                                            uint64_t bytes, int current_device) {
  cudaIpcMemHandle_t handle;
  if (ipc_handle.size() != sizeof(handle)) {
    return InvalidArgument("cuda_ipc.ipc_handle: " + std::to_string(ipc_handle.size()) +
                           " bytes, expected the " + std::to_string(sizeof(handle)) +
                           " bytes of a cudaIpcMemHandle_t");
  }
  if (bytes == 0) return InvalidArgument("cuda_ipc.byte_size: 0, expected at least 1 byte");
  std::memcpy(&handle, ipc_handle.data(), sizeof(handle));
  if (const cudaError_t err = cudaSetDevice(current_device); err != cudaSuccess) {
    cudaGetLastError();
    return Internal("cuda backend: selecting device " + std::to_string(current_device) + ": " +
                    ErrorText(err));
  }
  void* base = nullptr;
  if (const cudaError_t err = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
      err != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it so that no later call reports it
    return InvalidArgument(
        "cuda_ipc.ipc_handle: does not open on this host's device " +
        std::to_string(current_device) + " (" + ErrorText(err) +
        "); expected a live cudaIpcGetMemHandle export of another process on this host");
  }
  auto memory = std::make_shared<CudaImportedMemory>(base, current_device);
  cudaPointerAttributes attributes{};
  if (const cudaError_t err = cudaPointerGetAttributes(&attributes, base); err != cudaSuccess) {
    cudaGetLastError();
    return InvalidArgument("cuda_ipc.ipc_handle: the opened memory has no attributes (" +
                           ErrorText(err) + ")");
  }
  if (attributes.type != cudaMemoryTypeDevice || attributes.device != device) {
    return InvalidArgument("cuda_ipc.device_id: " + std::to_string(device) +
                           ", but the allocation is on device " +
                           std::to_string(attributes.device));
  }
  // The allocation's extent, from the driver (the runtime has no query for it).
  using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  GetAddressRange get_range = nullptr;
  CUdeviceptr range_base = 0;
  size_t range_bytes = 0;
  if (!kernels::ResolveDriverEntry("cuMemGetAddressRange", 3020, &get_range) ||
      get_range(&range_base, &range_bytes, reinterpret_cast<CUdeviceptr>(base)) != CUDA_SUCCESS) {
    return Internal("cuda backend: the driver does not tell the imported allocation's size");
  }
  const uint64_t allocation = range_bytes - (reinterpret_cast<CUdeviceptr>(base) - range_base);
  if (offset > allocation || bytes > allocation - offset) {
    return InvalidArgument("cuda_ipc: bytes [" + std::to_string(offset) + ", " +
                           std::to_string(offset) + " + " + std::to_string(bytes) +
                           ") are outside the exported allocation's " + std::to_string(allocation) +
                           " bytes");
  }
  memory->data = static_cast<uint8_t*>(base) + offset;
  memory->size = bytes;
  return std::shared_ptr<ImportedMemory>(std::move(memory));
}

}  // namespace gcmoe::engine
