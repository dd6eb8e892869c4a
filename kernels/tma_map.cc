#include "kernels/tma_map.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <mutex>

#include "kernels/driver_entry.h"

namespace gcmoe::kernels {

static_assert(sizeof(TmaMap) == sizeof(CUtensorMap) && alignof(TmaMap) == alignof(CUtensorMap));

cudaError_t EncodeBf16TileMap(const void* base, int64_t rows, int64_t cols, TmaBox box, TmaMap* map,
                              int groups) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  static std::once_flag once;
  std::call_once(once, [] { ResolveDriverEntry("cuTensorMapEncodeTiled", 12000, &encode); });
  const bool wide = box == TmaBox::kK64Swizzled;
  const int box_rows = groups * (wide ? kTmaWideRows : kTmaRowGroup);
  if (encode == nullptr || rows <= 0 || cols <= 0 || cols % 64 != 0 || groups < 1 ||
      box_rows > 256) {
    return cudaErrorInvalidValue;
  }
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};  // bytes, of dim 1
  const cuuint32_t box_dims[2] = {wide ? 64u : 32u, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(reinterpret_cast<CUtensorMap*>(map), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                            2, const_cast<void*>(base), dims, strides, box_dims, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE,
                            wide ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace gcmoe::kernels
