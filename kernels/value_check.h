// The service's value checks (DESIGN.md §4) for tensors that never reach the host: activations
// read from and outputs written to a client's GPU memory (RegisterMemory's cuda_ipc), checked as
// they are copied.
#pragma once

#include <cstdint>
#include <span>

#include <cuda_runtime.h>

namespace gcmoe::kernels {

// One range of rows to copy: row r of `rows` is at src + r * src_pitch and goes to
// dst + r * dst_pitch (pitches in bytes).
struct RowCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t rows = 0;
  int64_t src_pitch = 0;
  int64_t dst_pitch = 0;
};

// Copies the first `row_values` values (BF16, or FP32 when `fp32`) of every row of every range,
// and lowers first[i] to the smallest index (row * row_values + column) within range i whose
// value is not within [-limit, limit]; NaN never is. The copy is made whatever the values. The
// caller sets first[0 .. copies.size()) to ~0 beforehand and reads them once `stream` has run
// the copies. A limit of FLT_MAX finds the first Inf or NaN. Ranges must not overlap; any
// address and pitch is allowed (the widest access they all allow is used).
cudaError_t LaunchCopyRowsChecked(std::span<const RowCopy> copies, int64_t row_values, bool fp32,
                                  float limit, unsigned long long* first, cudaStream_t stream);

}  // namespace gcmoe::kernels
