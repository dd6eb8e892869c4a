// Internal: a read-only view of a safetensors file, memory-mapped.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the data section; offsets are relative to its start. Open() validates the header
// completely (JSON, field types, known dtypes' byte sizes, offsets inside the file), so every
// pointer it hands out lies inside the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace gcmoe::engine {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", "U8", ... as written in the header
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section
  uint64_t end = 0;
  uint64_t bytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const std::string& path() const { return path_; }
  uint64_t file_bytes() const { return file_bytes_; }
  // nullptr when the file has no tensor of that name.
  const SafetensorsTensor* Find(const std::string& name) const;
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's bytes inside the mapping (not necessarily aligned: read with memcpy).
  const uint8_t* data(const SafetensorsTensor& tensor) const { return data_ + tensor.begin; }
  // Hands the pages wholly inside [offset, offset + bytes) of the tensor back to the kernel, so
  // a streaming load holds one layer of a large checkpoint in memory, not all of it. The bytes
  // stay readable: a later read faults them in from the file again.
  void DropPages(const SafetensorsTensor& tensor, uint64_t offset, uint64_t bytes) const;

 private:
  SafetensorsFile() = default;
  Status ParseHeader(const char* json, size_t json_bytes, uint64_t data_bytes);

  std::string path_;
  void* mapping_ = nullptr;
  uint64_t file_bytes_ = 0;
  const uint8_t* data_ = nullptr;
  std::map<std::string, SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Bytes per element of a safetensors dtype name; 0 when the dtype is unknown.
size_t SafetensorsDTypeBytes(const std::string& dtype);

}  // namespace gcmoe::engine
