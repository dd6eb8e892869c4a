// The requests `gcmoe client forward` sends: random ones shaped by the model's (H, E, k), or one
// read from .npy files.
#pragma once

#include <cstdint>
#include <string>

#include "client/tensors.h"
#include "common/status.h"

namespace gcmoe::client {

struct RandomRequestOptions {
  int tokens = 0;
  int hidden = 0;
  int experts = 0;
  int top_k = 0;
  // 0: every expert equally likely. X > 0: expert popularity follows a Zipf law with exponent
  // X (the r-th most popular expert has weight 1 / r^X), the ranking a seeded permutation of
  // the experts, so hot experts land on some ranks more than others, as in real routing.
  double skew = 0.0;
  uint64_t popularity_seed = 0;  // fixes which experts are hot (same across requests)
  uint64_t seed = 0;             // this request's activations and draws
};

// Activations ~ N(0, 1); per token k distinct experts drawn without replacement by
// popularity; routing weights a softmax over k N(0, 1) logits (positive, summing to 1).
RequestArrays RandomRequest(const RandomRequestOptions& options);

// The probability of each expert under `skew` (sums to 1), indexed by expert id.
std::vector<double> ExpertPopularity(int experts, double skew, uint64_t popularity_seed);

// A request from DIR/hidden.npy ([T, H] float32/float64/float16), DIR/topk_ids.npy ([T, k]
// int32/int64) and DIR/topk_weights.npy ([T, k] float32/float64).
Result<RequestArrays> ReadRequestDir(const std::string& dir);

}  // namespace gcmoe::client
