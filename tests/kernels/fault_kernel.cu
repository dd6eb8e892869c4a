// A kernel that faults on purpose, for the test of what the CUDA backend does once its context is
// broken (cuda_device_lost_test.cc).
#include "tests/kernels/fault_kernel.h"

namespace gcmoe::kernels_test {
namespace {

__global__ void StoreThrough(int* target) { *target = 1; }

}  // namespace

cudaError_t LaunchFaultingKernel() {
  StoreThrough<<<1, 1>>>(nullptr);
  const cudaError_t launched = cudaGetLastError();
  return launched != cudaSuccess ? launched : cudaDeviceSynchronize();
}

}  // namespace gcmoe::kernels_test
