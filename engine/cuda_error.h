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

}  // namespace gcmoe::engine
