// The shape and activation of the MoE model the engine serves (engine-level; server/ maps the
// JSON config onto it so the engine never depends on config/).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace gcmoe::engine {

struct ModelSpec {
  int hidden = 0;        // H
  int intermediate = 0;  // I, per routed expert
  int num_experts = 0;   // E
  int top_k = 0;         // k
  int num_layers = 0;
  int shared_intermediate = 0;  // I_s; 0 = no shared expert
  float activation_alpha = 1.0f;
  std::optional<float> activation_clamp;  // none = no clamp
  // Added to the up half before the product: gpt-oss computes g * sigmoid(a g) * (u + 1).
  float activation_up_offset = 0.0f;
  // Model layer index of each served (MoE) layer: a checkpoint's dense layers are skipped, so
  // MoE layer l may be model layer moe_layer_ids[l]. Empty = the identity.
  std::vector<int> moe_layer_ids;
  std::string weights;  // "synthetic:SEED", a safetensors path or "hf:DIR"

  bool has_shared() const { return shared_intermediate > 0; }
  // The numerics' own constraints: H, I and I_s multiples of 32 (block scaling), k <= E, ...
  Status Validate() const;
};

}  // namespace gcmoe::engine
