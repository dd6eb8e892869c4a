// Float64 references of one MoE layer for tests and tools (not used on the serving path).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "engine/model_spec.h"
#include "engine/weights.h"

namespace gcmoe::engine {

enum class ReferenceMode {
  // DESIGN.md §4 step by step with the quantized weights, E4M3 activations and the same
  // rounding points (BF16 after each GEMM, E4M3 requantization of h), accumulating in float64.
  kQuantizationAware,
  // The same layer on the full-precision weights and activations, no quantization, no rounding.
  kUnquantized,
};

struct ReferenceInput {
  int num_tokens = 0;
  const float* hidden = nullptr;        // [T, H] request values as floats
  const uint8_t* hidden_fp8 = nullptr;  // optional [T, H] E4M3: the request was already FP8
  const uint8_t* hidden_scales = nullptr;  // [T, H/32] UE8M0 with hidden_fp8
  const int32_t* topk_ids = nullptr;    // [T, k], -1 = unused slot
  const float* topk_weights = nullptr;  // [T, k]
};

// Returns y: [T, H] in float64 (before the output's BF16 rounding).
Result<std::vector<double>> ReferenceLayer(const WeightSource& weights, int layer,
                                           const ReferenceInput& input, ReferenceMode mode);

}  // namespace gcmoe::engine
