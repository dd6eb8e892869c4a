// The CUDA backend's one error helper, shared by its source files (engine-internal).
#pragma once

#include <string>

#include <cuda_runtime.h>

#include "common/status.h"

namespace gcmoe::engine {

// A failed CUDA runtime call as an Internal status naming what was being done.
inline Status CudaError(const std::string& what, cudaError_t err) {
  return Internal("cuda backend: " + what + ": " + cudaGetErrorString(err));
}

// Whether `err` leaves the CUDA context unusable: a kernel faulted or trapped, or the hardware
// failed. Every later runtime call in the process then returns the same error.
inline bool IsStickyCudaError(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContextIsDestroyed:
      return true;
    default:
      return false;
  }
}

}  // namespace gcmoe::engine
