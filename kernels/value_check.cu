#include "kernels/value_check.h"

#include <algorithm>

namespace gcmoe::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocksPerCopy = 256;
constexpr int kCopiesPerLaunch = 32;  // the ranges travel in the kernel's parameters

struct CopyBatch {
  RowCopy copies[kCopiesPerLaunch];
  unsigned long long* first;  // first[blockIdx.y]
  int64_t row_values;
  float limit;
};

__device__ bool Beyond(float v, float limit) { return !(fabsf(v) <= limit); }

// kUnit bytes per thread and step: 16 (vector loads and stores) when every address and pitch
// allows, else one value, loaded and stored byte by byte (kBytewise) when an address or pitch is
// not a multiple of the value's size: a client's tensor may start anywhere, and a misaligned
// load would end the rank's CUDA context.
template <bool kFp32, int kUnit, bool kBytewise>
__global__ void __launch_bounds__(kThreads)
    CopyRowsCheckedKernel(const __grid_constant__ CopyBatch batch) {
  const RowCopy& c = batch.copies[blockIdx.y];
  constexpr int kValueBytes = kFp32 ? 4 : 2;
  constexpr int kValues = kUnit / kValueBytes;
  const int64_t units_per_row = batch.row_values / kValues;
  const int64_t units = c.rows * units_per_row;
  const auto* src = static_cast<const uint8_t*>(c.src);
  auto* dst = static_cast<uint8_t*>(c.dst);
  unsigned long long mine = ~0ull;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; u < units;
       u += stride) {
    const int64_t row = u / units_per_row;
    const int64_t column = (u - row * units_per_row) * kValues;
    const uint8_t* from = src + row * c.src_pitch + column * kValueBytes;
    uint8_t* to = dst + row * c.dst_pitch + column * kValueBytes;
    float values[kValues];
    if constexpr (kUnit == 16) {
      const uint4 v = *reinterpret_cast<const uint4*>(from);
      *reinterpret_cast<uint4*>(to) = v;
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
      for (int i = 0; i < 4; ++i) {
        if constexpr (kFp32) {
          values[i] = __uint_as_float(words[i]);
        } else {
          values[2 * i] = __uint_as_float(words[i] << 16);
          values[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
        }
      }
    } else if constexpr (kBytewise) {
      uint32_t bits = 0;
      for (int b = 0; b < kValueBytes; ++b) {
        to[b] = from[b];
        bits |= static_cast<uint32_t>(from[b]) << (8 * b);
      }
      values[0] = __uint_as_float(kFp32 ? bits : bits << 16);
    } else if constexpr (kFp32) {
      const float v = *reinterpret_cast<const float*>(from);
      *reinterpret_cast<float*>(to) = v;
      values[0] = v;
    } else {
      const uint16_t v = *reinterpret_cast<const uint16_t*>(from);
      *reinterpret_cast<uint16_t*>(to) = v;
      values[0] = __uint_as_float(static_cast<uint32_t>(v) << 16);
    }
    // A thread's indices rise: its first hit is its smallest.
    if (mine == ~0ull) {
      for (int i = 0; i < kValues; ++i) {
        if (Beyond(values[i], batch.limit)) {
          mine = static_cast<unsigned long long>(row * batch.row_values + column + i);
          break;
        }
      }
    }
  }
  for (int lane_mask = 16; lane_mask > 0; lane_mask >>= 1) {
    mine = min(mine, __shfl_xor_sync(0xffffffffu, mine, lane_mask));
  }
  if ((threadIdx.x & 31) == 0 && mine != ~0ull) atomicMin(&batch.first[blockIdx.y], mine);
}

bool Aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <bool kFp32>
void Launch(const CopyBatch& batch, dim3 grid, int unit, bool bytewise, cudaStream_t stream) {
  constexpr int kValueBytes = kFp32 ? 4 : 2;
  if (unit == 16) {
    CopyRowsCheckedKernel<kFp32, 16, false><<<grid, kThreads, 0, stream>>>(batch);
  } else if (bytewise) {
    CopyRowsCheckedKernel<kFp32, kValueBytes, true><<<grid, kThreads, 0, stream>>>(batch);
  } else {
    CopyRowsCheckedKernel<kFp32, kValueBytes, false><<<grid, kThreads, 0, stream>>>(batch);
  }
}

}  // namespace

cudaError_t LaunchCopyRowsChecked(std::span<const RowCopy> copies, int64_t row_values, bool fp32,
                                  float limit, unsigned long long* first, cudaStream_t stream) {
  const int value_bytes = fp32 ? 4 : 2;
  for (size_t begin = 0; begin < copies.size(); begin += kCopiesPerLaunch) {
    const size_t n = std::min<size_t>(kCopiesPerLaunch, copies.size() - begin);
    CopyBatch batch{};
    batch.first = first + begin;
    batch.row_values = row_values;
    batch.limit = limit;
    // The widest access every range's addresses and pitches allow.
    auto allows = [&](int bytes) {
      for (size_t i = 0; i < n; ++i) {
        const RowCopy& c = copies[begin + i];
        if (!Aligned(c.src, bytes) || !Aligned(c.dst, bytes) || c.src_pitch % bytes != 0 ||
            c.dst_pitch % bytes != 0) {
          return false;
        }
      }
      return true;
    };
    int64_t most_bytes = 0;
    for (size_t i = 0; i < n; ++i) {
      const RowCopy& c = copies[begin + i];
      batch.copies[i] = c;
      most_bytes = std::max(most_bytes, c.rows * row_values * value_bytes);
    }
    const bool vector = (row_values * value_bytes) % 16 == 0 && allows(16);
    const bool bytewise = !vector && !allows(value_bytes);
    if (most_bytes == 0) continue;
    // About four units a thread, at most kMaxBlocksPerCopy blocks (grid-stride beyond).
    const int unit = vector ? 16 : value_bytes;
    const int64_t blocks = std::clamp<int64_t>(
        (most_bytes / unit + kThreads * 4 - 1) / (kThreads * 4), 1, kMaxBlocksPerCopy);
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(n));
    if (fp32) {
      Launch<true>(batch, grid, unit, bytewise, stream);
    } else {
      Launch<false>(batch, grid, unit, bytewise, stream);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace gcmoe::kernels
