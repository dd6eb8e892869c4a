// The per-assignment expert math of DESIGN.md §4 on the CPU, for the CPU backend.
//
// Invariant the multi-rank tests rely on: every output row depends only on its own input row,
// its routing weight and the expert's weights, never on which or how many other rows share the
// call. A (token, expert) partial is therefore bit-identical wherever and with whomever it is
// computed, which makes outputs independent of the rank count and the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model_spec.h"
#include "engine/weights.h"

namespace gcmoe::engine {

// Per-thread working memory, reused across calls (sized on first use).
struct FfnScratch {
  std::vector<float> x;       // dequantized activation rows
  std::vector<float> w_rows;  // decoded weight rows
  std::vector<float> act;     // [rows, 2I] W1 outputs
  std::vector<float> h;       // [rows, I] SwiGLU outputs, dequantized after E4M3 requantization
};

// Routed expert over `rows` assignments. For row r:
//   x_rows[r]: [H] E4M3, x_scale_rows[r]: [H/32] UE8M0, route_weights[r]: the routing weight,
//   out_rows[r]: [H] BF16 bits, the partial p_j of DESIGN.md §4 step 4.
void RoutedExpertFfn(const ModelSpec& spec, const ExpertWeights& w, int rows,
                     const uint8_t* const* x_rows, const uint8_t* const* x_scale_rows,
                     const float* route_weights, uint16_t* const* out_rows, FfnScratch* scratch);

// Shared expert (E4M3 weights, routing weight 1) over `rows` tokens; same row contract.
void SharedExpertFfn(const ModelSpec& spec, const SharedExpertWeights& w, int rows,
                     const uint8_t* const* x_rows, const uint8_t* const* x_scale_rows,
                     uint16_t* const* out_rows, FfnScratch* scratch);

}  // namespace gcmoe::engine
