#include "engine/safetensors_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace gcmoe::engine {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swaps");

// The reference implementation's limit: a larger header is certainly not a weights file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::string ErrnoText() { return std::strerror(errno); }

}  // namespace

size_t SafetensorsDTypeBytes(const std::string& dtype) {
  static const std::map<std::string, size_t> kBytes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  const auto it = kBytes.find(dtype);
  return it == kBytes.end() ? 0 : it->second;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) munmap(mapping_, file_bytes_);
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound(path + ": cannot open: " + ErrnoText());
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const Status status = Internal(path + ": cannot stat: " + ErrnoText());
    ::close(fd);
    return status;
  }
  file->file_bytes_ = static_cast<uint64_t>(st.st_size);
  if (file->file_bytes_ < 8) {
    ::close(fd);
    return DataLoss(path + ": " + std::to_string(file->file_bytes_) +
                    " bytes, too short for a safetensors header (truncated file?)");
  }
  void* mapping = mmap(nullptr, file->file_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  if (mapping == MAP_FAILED) return Internal(path + ": cannot mmap: " + ErrnoText());
  file->mapping_ = mapping;
  const auto* bytes = static_cast<const uint8_t*>(mapping);

  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes, 8);
  if (header_bytes > kMaxHeaderBytes) {
    return DataLoss(path + ": header length " + std::to_string(header_bytes) +
                    " exceeds the 100 MiB limit (not a safetensors file?)");
  }
  if (header_bytes > file->file_bytes_ - 8) {
    return DataLoss(path + ": header length " + std::to_string(header_bytes) +
                    " runs past the end of the " + std::to_string(file->file_bytes_) +
                    "-byte file (truncated file?)");
  }
  file->data_ = bytes + 8 + header_bytes;
  const uint64_t data_bytes = file->file_bytes_ - 8 - header_bytes;
  Status status =
      file->ParseHeader(reinterpret_cast<const char*>(bytes + 8), header_bytes, data_bytes);
  if (!status.ok()) return status.WithContext(path);
  return file;
}

Status SafetensorsFile::ParseHeader(const char* json_text, size_t json_bytes, uint64_t data_bytes) {
  // nlohmann reports bad JSON by exception; it stops here, at the boundary.
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json_text, json_text + json_bytes);
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) return DataLoss("header is not a JSON object");
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return DataLoss("__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) return DataLoss("__metadata__." + key + " is not a string");
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor " + name + ": ";
    if (!entry.is_object()) return DataLoss(where + "entry is not an object");
    const auto dtype = entry.find("dtype");
    const auto shape = entry.find("shape");
    const auto offsets = entry.find("data_offsets");
    if (dtype == entry.end() || !dtype->is_string()) return DataLoss(where + "no string dtype");
    if (shape == entry.end() || !shape->is_array()) return DataLoss(where + "no shape array");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return DataLoss(where + "data_offsets must be two non-negative integers");
    }
    SafetensorsTensor tensor;
    tensor.name = name;
    tensor.dtype = dtype->get<std::string>();
    uint64_t elements = 1;
    for (const auto& dim : *shape) {
      if (!dim.is_number_unsigned()) return DataLoss(where + "shape has a non-integer entry");
      const uint64_t d = dim.get<uint64_t>();
      if (d > (1ull << 40) || (d != 0 && elements > (1ull << 50) / d)) {
        return DataLoss(where + "shape is implausibly large");
      }
      elements *= d;
      tensor.shape.push_back(static_cast<int64_t>(d));
    }
    tensor.begin = (*offsets)[0].get<uint64_t>();
    tensor.end = (*offsets)[1].get<uint64_t>();
    if (tensor.begin > tensor.end) return DataLoss(where + "data_offsets begin > end");
    if (tensor.end > data_bytes) {
      return DataLoss(where + "data_offsets [" + std::to_string(tensor.begin) + ", " +
                      std::to_string(tensor.end) + "] run past the " + std::to_string(data_bytes) +
                      "-byte data section (truncated file?)");
    }
    const size_t element_bytes = SafetensorsDTypeBytes(tensor.dtype);
    if (element_bytes == 0) return DataLoss(where + "unknown dtype " + tensor.dtype);
    if (tensor.bytes() != elements * element_bytes) {
      return DataLoss(where + "holds " + std::to_string(tensor.bytes()) + " bytes, its dtype " +
                      "and shape need " + std::to_string(elements * element_bytes));
    }
    tensors_.emplace(name, std::move(tensor));
  }
  return Status::Ok();
}

void SafetensorsFile::DropPages(const SafetensorsTensor& tensor, uint64_t offset,
                                uint64_t bytes) const {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t base = reinterpret_cast<uint64_t>(mapping_);
  const uint64_t begin = reinterpret_cast<uint64_t>(data_) + tensor.begin + offset;
  const uint64_t first = (begin + page - 1) / page * page;
  const uint64_t last = (begin + bytes) / page * page;
  if (last <= first || first < base) return;
  // Advice only: a failure leaves the pages cached, which costs memory, not correctness.
  madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

const SafetensorsTensor* SafetensorsFile::Find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace gcmoe::engine
