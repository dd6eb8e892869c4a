// A kernel that faults on purpose (an illegal address), for the tests of a broken CUDA context.
#pragma once

#include <cuda_runtime.h>

namespace gcmoe::kernels_test {

// Runs a kernel that stores through a null pointer and waits for it; returns the error that
// leaves (cudaErrorIllegalAddress: this process's context is unusable from then on).
cudaError_t LaunchFaultingKernel();

}  // namespace gcmoe::kernels_test
