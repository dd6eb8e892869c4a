#include "engine/safetensors_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/safetensors_reader.h"

namespace gcmoe::engine {

SafetensorsWriter::~SafetensorsWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(temp_path_.c_str());
  }
}

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<SafetensorsTensorDecl> tensors,
    const std::map<std::string, std::string>& metadata) {
  std::unique_ptr<SafetensorsWriter> writer(new SafetensorsWriter());
  writer->path_ = path;
  writer->temp_path_ = path + ".tmp." + std::to_string(getpid());

  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsTensorDecl& t : tensors) {
    const size_t element_bytes = SafetensorsDTypeBytes(t.dtype);
    if (element_bytes == 0) return InvalidArgument(t.name + ": unknown dtype " + t.dtype);
    if (header.contains(t.name)) return InvalidArgument(t.name + ": declared twice");
    uint64_t bytes = element_bytes;
    for (int64_t d : t.shape) {
      if (d < 0) return InvalidArgument(t.name + ": negative dimension");
      bytes *= static_cast<uint64_t>(d);
    }
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset,
                                                                                offset + bytes}}};
    writer->tensor_bytes_.push_back(bytes);
    offset += bytes;
  }
  writer->tensors_ = std::move(tensors);

  std::string text;
  try {
    text = header.dump();  // throws only on invalid UTF-8 in a name; stop it here
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("safetensors header: ") + e.what());
  }
  // Pad with spaces so the data section starts 8-byte aligned, as other writers do.
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_bytes = text.size();

  writer->file_ = std::fopen(writer->temp_path_.c_str(), "wb");
  if (writer->file_ == nullptr) {
    return Unavailable(writer->temp_path_ + ": cannot create: " + std::strerror(errno));
  }
  if (std::fwrite(&header_bytes, 8, 1, writer->file_) != 1 ||
      std::fwrite(text.data(), 1, text.size(), writer->file_) != text.size()) {
    return DataLoss(writer->temp_path_ + ": write failed: " + std::strerror(errno));
  }
  return writer;
}

Status SafetensorsWriter::Append(const void* data, size_t bytes) {
  // Skip finished (and empty) tensors so a chunk lands on the tensor it belongs to.
  while (current_ < tensors_.size() && current_done_ == tensor_bytes_[current_]) {
    ++current_;
    current_done_ = 0;
  }
  if (current_ >= tensors_.size()) return Internal(path_ + ": more data than declared");
  if (current_done_ + bytes > tensor_bytes_[current_]) {
    return Internal(path_ + ": chunk of " + std::to_string(bytes) + " bytes crosses the end of " +
                    tensors_[current_].name);
  }
  if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes) {
    return DataLoss(temp_path_ + ": write failed: " + std::strerror(errno));
  }
  current_done_ += bytes;
  return Status::Ok();
}

Status SafetensorsWriter::Finish() {
  while (current_ < tensors_.size() && current_done_ == tensor_bytes_[current_]) {
    ++current_;
    current_done_ = 0;
  }
  if (current_ < tensors_.size()) {
    return Internal(path_ + ": " + tensors_[current_].name + " got " +
                    std::to_string(current_done_) + " of its " +
                    std::to_string(tensor_bytes_[current_]) + " bytes");
  }
  const bool flushed = std::fflush(file_) == 0 && fsync(fileno(file_)) == 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed || !closed) {
    std::remove(temp_path_.c_str());
    return DataLoss(temp_path_ + ": write failed: " + std::strerror(errno));
  }
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const Status status = DataLoss(path_ + ": cannot rename into place: " + std::strerror(errno));
    std::remove(temp_path_.c_str());
    return status;
  }
  return Status::Ok();
}

}  // namespace gcmoe::engine
