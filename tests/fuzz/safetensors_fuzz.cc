// libFuzzer target: the safetensors reader (engine/safetensors_reader.h) and the weight source on
// top of it (engine/file_weights.h) on arbitrary file contents. The bytes go to an anonymous
// in-memory file opened by its /proc path, so the real open + mmap path runs. A file the reader
// accepts must keep its promise that every tensor lies inside the mapping (ASan cannot see
// mmap'd memory, so that is checked here, and every byte is read); a file the weight source
// accepts for a small model must load every expert, dense and quantized.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include "engine/file_weights.h"
#include "engine/safetensors_reader.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "safetensors_fuzz: %s\n", what.c_str());
  std::abort();
}

// The smallest shape the numerics allow (multiples of 32), with a shared expert, so a file
// that passes the header checks has a chance to match it: the seeds are this shape.
gcmoe::engine::ModelSpec SmallModel(const std::string& path) {
  gcmoe::engine::ModelSpec spec;
  spec.hidden = 32;
  spec.intermediate = 32;
  spec.num_experts = 2;
  spec.top_k = 1;
  spec.num_layers = 1;
  spec.shared_intermediate = 32;
  spec.weights = path;
  return spec;
}

// data_bytes: what follows the 8-byte length and the header in the input.
void CheckReader(const gcmoe::engine::SafetensorsFile& file, uint64_t data_bytes) {
  for (const auto& [name, tensor] : file.tensors()) {
    if (tensor.begin > tensor.end || tensor.end > data_bytes) {
      Fail(name + ": accepted with offsets outside the data section");
    }
    uint64_t elements = 1;
    for (int64_t d : tensor.shape) elements *= static_cast<uint64_t>(d);
    if (tensor.bytes() != elements * gcmoe::engine::SafetensorsDTypeBytes(tensor.dtype)) {
      Fail(name + ": accepted with a byte size that does not match its dtype and shape");
    }
    const uint8_t* bytes = file.data(tensor);
    uint8_t sum = 0;
    for (uint64_t i = 0; i < tensor.bytes(); ++i) sum ^= bytes[i];
    // Keeps the reads: a byte outside the mapping faults here.
    asm volatile("" : : "r"(sum));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // unused-tensor warnings on every other input
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("safetensors_fuzz", MFD_CLOEXEC);
  if (fd < 0) Fail("memfd_create failed");
  if (ftruncate(fd, 0) != 0) Fail("ftruncate failed");
  if (pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) Fail("pwrite failed");
  const std::string path = "/proc/self/fd/" + std::to_string(fd);

  auto file = gcmoe::engine::SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, data, 8);  // Open refused files shorter than 8 bytes
  CheckReader(*file.value(), size - 8 - header_bytes);

  auto source = gcmoe::engine::FileWeightSource::Open(SmallModel(path));
  if (!source.ok()) return 0;
  // Loads may still refuse bad values (NaN, UE8M0 255): a clear error, never a crash.
  for (int expert = 0; expert < 2; ++expert) {
    (void)source.value()->LoadExpert(0, expert);
    (void)source.value()->LoadExpertDense(0, expert);
  }
  (void)source.value()->LoadShared(0);
  (void)source.value()->LoadSharedDense(0);
  (void)source.value()->CheckExperts({0}, {0, 1});
  return 0;
}
