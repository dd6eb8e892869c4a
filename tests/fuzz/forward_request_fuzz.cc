// libFuzzer target: a ForwardRequest as it arrives on the wire, its registered-memory
// references resolved and the whole validated against the embedded default model exactly as
// the coordinator does before anything reaches a rank (server/forward_regions.h,
// server/forward_validation.h). Beyond "no crash, no sanitizer report", it checks what the
// coordinator relies on when validation passes: a token count within capacity, shards that add
// up, per-rank expert counts that match the ids, and tensor bytes that lie inside what they
// name (the message, or the registration).
//
// One registration exists, "fuzz": 64 KiB of a POSIX shared-memory object laid out for requests
// of up to 32 tokens (make_seeds.py's region seeds use these offsets): BF16 activations at 0,
// top-k ids at kIdsAt (token t: experts t..t+3 mod 16), weights 0.25 at kWeightsAt, and room for
// an FP32 output at 24 KiB.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "server/forward_regions.h"
#include "server/forward_validation.h"
#include "server/memory_registry.h"

namespace {

using gcmoe::server::ForwardBytes;
using gcmoe::server::ForwardLimits;
using gcmoe::server::MemoryRegistry;
using gcmoe::server::TensorBytes;
using gcmoe::server::ValidatedForward;

constexpr size_t kRegionBytes = 64 << 10;
constexpr size_t kIdsAt = 16 << 10;
constexpr size_t kWeightsAt = 20 << 10;

ForwardLimits DefaultLimits() {
  const gcmoe::config::Config config = gcmoe::config::DefaultConfig();
  ForwardLimits limits;
  limits.hidden = config.model.hidden;
  limits.experts = config.model.experts;
  limits.top_k = config.model.top_k;
  limits.layers = config.model.layers;
  limits.max_tokens = config.max_tokens();
  limits.world_size = config.parallel.ranks;
  return limits;
}

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "forward_request_fuzz: %s\n", what);
  std::abort();
}

struct Registration {
  MemoryRegistry registry;
  const uint8_t* base = nullptr;  // the registration's bytes as the service maps them
};

const Registration& Registered() {
  static Registration* r = [] {
    auto* made = new Registration();
    const std::string key = "/gcmoe_fuzz-" + std::to_string(getpid());
    const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, kRegionBytes) != 0) Fail("cannot create the registered object");
    void* map = mmap(nullptr, kRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) Fail("cannot map the registered object");
    auto* bytes = static_cast<uint8_t*>(map);
    for (size_t i = 0; i < kIdsAt / 2; ++i) {  // BF16 values of +-0.5 .. +-1.75
      const uint16_t v = static_cast<uint16_t>(0x3F00 | ((i * 37) & 0x7F) | ((i & 1) << 15));
      std::memcpy(bytes + 2 * i, &v, 2);
    }
    for (int32_t t = 0; t < 32; ++t) {
      for (int32_t j = 0; j < 4; ++j) {
        const int32_t e = (t + j) % 16;
        const float w = 0.25f;
        std::memcpy(bytes + kIdsAt + 4 * (4 * t + j), &e, 4);
        std::memcpy(bytes + kWeightsAt + 4 * (4 * t + j), &w, 4);
      }
    }
    const gcmoe::Status status = made->registry.RegisterPosixShm("", "fuzz", key, 0, kRegionBytes);
    shm_unlink(key.c_str());
    close(fd);
    if (!status.ok()) Fail("cannot register the object");
    gcmoe::Result<gcmoe::server::RegionBytes> whole =
        made->registry.Resolve("", "fuzz", "fuzz", 0, kRegionBytes);
    if (!whole.ok()) Fail("cannot resolve the registration");
    made->base = whole->data;
    munmap(map, kRegionBytes);
    return made;
  }();
  return *r;
}

// Bytes the validated request reads lie inside what the request named: its own message, or the
// registration.
void CheckWithin(const TensorBytes& t, const gcmoe::v1::Tensor& tensor, const char* what) {
  if (t.size == 0) return;
  const uint8_t* begin;
  size_t size;
  if (t.in_region) {
    begin = Registered().base;
    size = kRegionBytes;
  } else {
    begin = reinterpret_cast<const uint8_t*>(tensor.data().data());
    size = tensor.data().size();
  }
  if (t.data < begin || t.data + t.size > begin + size) Fail(what);
}

// The invariants of an accepted request, recomputed from the request itself.
void CheckAccepted(const gcmoe::v1::ForwardRequest& request, const ForwardLimits& limits,
                   const ForwardBytes& bytes, const ValidatedForward& v) {
  if (v.num_tokens < 1 || v.num_tokens > limits.max_tokens) Fail("token count out of range");
  if (v.num_tokens != request.hidden().shape(0)) Fail("token count is not hidden.shape[0]");
  if (static_cast<int>(v.tokens_per_rank.size()) != limits.world_size) Fail("shard count");
  int64_t shard_sum = 0;
  for (int n : v.tokens_per_rank) shard_sum += n;
  if (shard_sum != v.num_tokens) Fail("shards do not add up to the token count");
  if (v.counts.size() != static_cast<size_t>(limits.world_size) * limits.experts) {
    Fail("counts is not [P, E]");
  }
  CheckWithin(bytes.hidden, request.hidden(), "hidden's bytes lie outside what it names");
  CheckWithin(bytes.hidden_scales, request.hidden_scales(),
              "hidden_scales' bytes lie outside what they name");
  // The routing (ids, weights) from a region is validated and used from a copy
  // (server/forward_regions.h): only inline routing is checked for where it lies.
  if (!bytes.topk_weights.in_region) {
    CheckWithin(bytes.topk_weights, request.topk_weights(),
                "topk_weights' bytes lie outside the message");
  }
  if (bytes.output != nullptr) {
    const size_t value_bytes = v.output_fp32 ? 4 : 2;
    if (bytes.output_size != static_cast<size_t>(v.num_tokens) * limits.hidden * value_bytes) {
      Fail("output_region is not exactly [T, H]");
    }
    const uint8_t* base = Registered().base;
    if (bytes.output < base || bytes.output + bytes.output_size > base + kRegionBytes) {
      Fail("output_region lies outside the registration");
    }
  }
  // The ids as validated.
  const uint8_t* ids = bytes.topk_ids.data;
  if (bytes.topk_ids.size != static_cast<size_t>(v.num_tokens) * limits.top_k * 4) {
    Fail("ids bytes");
  }
  int64_t routed = 0;
  for (size_t i = 0; i < bytes.topk_ids.size / 4; ++i) {
    int32_t e;
    std::memcpy(&e, ids + 4 * i, 4);
    if (e < -1 || e >= limits.experts) Fail("an accepted expert id is out of range");
    if (e >= 0) ++routed;
  }
  int64_t counted = 0;
  for (int64_t c : v.counts) {
    if (c < 0) Fail("negative count");
    counted += c;
  }
  if (counted != routed) Fail("counts do not add up to the routed ids");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ForwardLimits limits = DefaultLimits();
  gcmoe::v1::ForwardRequest request;
  // gRPC refuses a body that does not parse before the service sees it.
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  ValidatedForward validated;
  ForwardBytes bytes;
  std::vector<std::shared_ptr<const void>> keep_alive;
  gcmoe::Status status =
      gcmoe::server::ResolveForwardBytes(request, &Registered().registry, "", &bytes, &keep_alive);
  if (status.ok()) status = gcmoe::server::ValidateForward(request, bytes, limits, &validated);
  if (status.ok()) {
    CheckAccepted(request, limits, bytes, validated);
    return 0;
  }
  if (status.message().empty()) Fail("a refusal without a message");
  switch (status.code()) {
    case gcmoe::StatusCode::kInvalidArgument:
    case gcmoe::StatusCode::kNotFound:
    case gcmoe::StatusCode::kResourceExhausted:
      break;
    default:
      Fail("a refusal with a code outside the API contract (DESIGN.md §3)");
  }
  return 0;
}
