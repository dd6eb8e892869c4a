// Validation of a ForwardRequest against the loaded model, at the coordinator, before anything
// reaches a rank. Every message names the field and the value expected (DESIGN.md §3).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "engine/backend.h"
#include "gcmoe/v1/moe.pb.h"

namespace gcmoe::server {

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
};

// Splits T tokens into P contiguous shards, the first T % P one token larger.
std::vector<int> ShardSizes(int num_tokens, int world_size);

Status ValidateForward(const gcmoe::v1::ForwardRequest& request, const ForwardLimits& limits,
                       ValidatedForward* out);

const char* DTypeName(gcmoe::v1::DType dtype);

}  // namespace gcmoe::server
