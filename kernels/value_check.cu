#include "kernels/value_check.h"

#include <algorithm>

namespace gcmoe::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;

__device__ float ValueAt(const void* data, bool fp32, int64_t i) {
  if (fp32) return static_cast<const float*>(data)[i];
  const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(data)[i]) << 16;
  return __uint_as_float(bits);
}

__global__ void __launch_bounds__(kThreads)
    FirstBeyondKernel(const void* data, bool fp32, int64_t n, float limit,
                      unsigned long long* first) {
  unsigned long long mine = ~0ull;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    // A thread's indices rise: its first hit is its smallest.
    if (!(fabsf(ValueAt(data, fp32, i)) <= limit)) {
      mine = static_cast<unsigned long long>(i);
      break;
    }
  }
  for (int lane_mask = 16; lane_mask > 0; lane_mask >>= 1) {
    mine = min(mine, __shfl_xor_sync(0xffffffffu, mine, lane_mask));
  }
  if ((threadIdx.x & 31) == 0 && mine != ~0ull) atomicMin(first, mine);
}

}  // namespace

cudaError_t LaunchFirstBeyond(const void* data, bool fp32, int64_t n, float limit,
                              unsigned long long* first, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((n + kThreads * 4 - 1) / (kThreads * 4), kMaxBlocks);
  FirstBeyondKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(data, fp32, n, limit,
                                                                            first);
  return cudaGetLastError();
}

}  // namespace gcmoe::kernels
