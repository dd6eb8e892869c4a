// NumPy .npy files (format versions 1-3, little-endian, C order): how `gcmoe client forward`
// reads a request a Python user wrote with np.save and saves the output for np.load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace gcmoe::client {

struct NpyArray {
  std::string descr;  // "<f4", "<f8", "<f2", "<i4", "<i8"
  std::vector<int64_t> shape;
  std::string data;  // raw little-endian elements, C order
};

Result<NpyArray> ReadNpy(const std::string& path);
// Parses the bytes of a .npy file; `name` is used in messages.
Result<NpyArray> ParseNpy(const std::string& bytes, const std::string& name);

// Elements as float (from <f4, <f8 or <f2) or int32 (from <i4, or <i8 when every value fits).
Result<std::vector<float>> NpyToFloat(const NpyArray& array, const std::string& name);
Result<std::vector<int32_t>> NpyToInt32(const NpyArray& array, const std::string& name);

// Writes a float32 array (descr "<f4", format 1.0).
Status WriteNpyFloat32(const std::string& path, const std::vector<int64_t>& shape,
                       const std::vector<float>& values);

}  // namespace gcmoe::client
