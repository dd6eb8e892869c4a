// The service's value checks (DESIGN.md §4) for tensors that never reach the host: activations
// read from and outputs written to a client's GPU memory (RegisterMemory's cuda_ipc).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace gcmoe::kernels {

// Lowers *first to the smallest index i < n whose value x[i] (BF16, or FP32 when `fp32`) is not
// within [-limit, limit]; NaN never is. The caller sets *first to ~0 beforehand and reads it once
// `stream` has run the kernel. A limit of FLT_MAX finds the first Inf or NaN.
cudaError_t LaunchFirstBeyond(const void* data, bool fp32, int64_t n, float limit,
                              unsigned long long* first, cudaStream_t stream);

}  // namespace gcmoe::kernels
