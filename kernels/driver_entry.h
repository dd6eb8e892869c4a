// Driver-API functions reached through the runtime's entry-point query, so nothing in
// gcmoe_kernels links libcuda (kernels/CMakeLists.txt says why).
#pragma once

#include <cuda_runtime.h>

namespace gcmoe::kernels {

// Resolves `symbol` at ABI `version` into *fn; false when the driver lacks it.
template <typename Fn>
bool ResolveDriverEntry(const char* symbol, unsigned int version, Fn* fn) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &address, version, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess || address == nullptr) {
    return false;
  }
  *fn = reinterpret_cast<Fn>(address);
  return true;
}

}  // namespace gcmoe::kernels
