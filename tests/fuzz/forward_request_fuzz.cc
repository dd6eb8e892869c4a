// libFuzzer target: a ForwardRequest as it arrives on the wire, decoded and validated against
// the embedded default model exactly as the coordinator does before anything reaches a rank
// (server/forward_validation.h). Beyond "no crash, no sanitizer report", it checks what the
// coordinator relies on when validation passes: a token count within capacity, shards that add
// up, and per-rank expert counts that match the ids.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "config/config.h"
#include "server/forward_validation.h"

namespace {

using gcmoe::server::ForwardLimits;
using gcmoe::server::ValidatedForward;

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

// The invariants of an accepted request, recomputed from the request itself.
void CheckAccepted(const gcmoe::v1::ForwardRequest& request, const ForwardLimits& limits,
                   const ValidatedForward& v) {
  if (v.num_tokens < 1 || v.num_tokens > limits.max_tokens) Fail("token count out of range");
  if (v.num_tokens != request.hidden().shape(0)) Fail("token count is not hidden.shape[0]");
  if (static_cast<int>(v.tokens_per_rank.size()) != limits.world_size) Fail("shard count");
  int64_t shard_sum = 0;
  for (int n : v.tokens_per_rank) shard_sum += n;
  if (shard_sum != v.num_tokens) Fail("shards do not add up to the token count");
  if (v.counts.size() != static_cast<size_t>(limits.world_size) * limits.experts) {
    Fail("counts is not [P, E]");
  }
  const std::string& ids = request.topk_ids().data();
  if (ids.size() != static_cast<size_t>(v.num_tokens) * limits.top_k * 4) Fail("ids bytes");
  int64_t routed = 0;
  for (size_t i = 0; i < ids.size() / 4; ++i) {
    int32_t e;
    std::memcpy(&e, ids.data() + 4 * i, 4);
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
  const gcmoe::Status status = gcmoe::server::ValidateForward(request, limits, &validated);
  if (status.ok()) {
    CheckAccepted(request, limits, validated);
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
