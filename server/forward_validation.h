// Validation of a ForwardRequest against the loaded model, at the coordinator, before anything
// reaches a rank. Every message names the field and the value expected (DESIGN.md §3).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/backend.h"
#include "gcmoe/v1/moe.pb.h"

namespace gcmoe::server {

// The largest magnitudes the service computes with (DESIGN.md §4): an activation as decoded from
// hidden (and its scales), and a routing weight. Larger ones are refused with INVALID_ARGUMENT
// naming the element, before anything reaches a rank.
inline constexpr float kMaxActivationMagnitude = 4294967296.0f;  // 2^32
inline constexpr float kMaxRoutingWeightMagnitude = 65536.0f;    // 2^16

struct ForwardLimits {
  int hidden = 0;
  int experts = 0;
  int top_k = 0;
  int layers = 0;
  int max_tokens = 0;  // parallel.ranks x engine.max_tokens_per_rank
  int world_size = 1;
};

struct ValidatedForward {
  int num_tokens = 0;
  engine::DType hidden_dtype = engine::DType::kBF16;
  bool output_fp32 = false;
  std::vector<int> tokens_per_rank;  // [P] contiguous shards: the source rank of each token
  std::vector<int64_t> counts;       // [P, E] C[src][expert]
  std::string request_id;            // the call's id (server/request_id.h), sent with its step
};

// Splits T tokens into P contiguous shards, the first T % P one token larger.
std::vector<int> ShardSizes(int num_tokens, int world_size);

Status ValidateForward(const gcmoe::v1::ForwardRequest& request, const ForwardLimits& limits,
                       ValidatedForward* out);

// An output is returned only when every element is finite: a layer that overflowed FP32 (weights
// can be as large as FP32 allows, so the input bounds alone cannot rule it out) fails the call
// with INVALID_ARGUMENT naming the element, never OK.
Status ValidateForwardOutput(const gcmoe::v1::Tensor& output);

const char* DTypeName(gcmoe::v1::DType dtype);

}  // namespace gcmoe::server
