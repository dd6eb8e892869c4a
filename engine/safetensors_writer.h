// Internal: streams a safetensors file to disk without holding its tensors in memory.
//
//   GCMOE_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::Create(path, tensors, metadata));
//   for each tensor in declaration order: writer->Append(bytes, n) one or more times;
//   GCMOE_RETURN_IF_ERROR(writer->Finish());
//
// Data is laid out in declaration order with no gaps (what the reference implementation
// requires). The file is written under a temporary name and renamed by Finish(), so a failed or
// abandoned write never leaves a partial file at `path`.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace gcmoe::engine {

struct SafetensorsTensorDecl {
  std::string name;
  std::string dtype;  // "F32", "BF16", "U8"
  std::vector<int64_t> shape;
};

class SafetensorsWriter {
 public:
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  static Result<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<SafetensorsTensorDecl> tensors,
      const std::map<std::string, std::string>& metadata);

  // The next bytes of the current tensor; a chunk may not cross into the next tensor.
  Status Append(const void* data, size_t bytes);
  // Checks that every tensor got all its bytes, flushes and renames into place.
  Status Finish();

 private:
  SafetensorsWriter() = default;

  std::string path_;
  std::string temp_path_;
  std::FILE* file_ = nullptr;
  std::vector<SafetensorsTensorDecl> tensors_;
  std::vector<uint64_t> tensor_bytes_;
  size_t current_ = 0;         // tensor being appended
  uint64_t current_done_ = 0;  // its bytes written so far
};

}  // namespace gcmoe::engine
