#include "engine/model_spec.h"

#include <string>

namespace gcmoe::engine {

Status ModelSpec::Validate() const {
  auto fail = [](const std::string& what) { return InvalidArgument("model: " + what); };
  if (hidden <= 0 || hidden % 32 != 0) {
    return fail("hidden is " + std::to_string(hidden) + ", expected a positive multiple of 32");
  }
  if (intermediate <= 0 || intermediate % 32 != 0) {
    return fail("intermediate is " + std::to_string(intermediate) +
                ", expected a positive multiple of 32");
  }
  if (num_experts <= 0) return fail("experts must be positive");
  if (top_k <= 0 || top_k > num_experts) {
    return fail("top_k is " + std::to_string(top_k) + ", expected 1.." +
                std::to_string(num_experts));
  }
  if (num_layers <= 0) return fail("layers must be positive");
  if (shared_intermediate < 0 || shared_intermediate % 32 != 0) {
    return fail("shared_intermediate is " + std::to_string(shared_intermediate) +
                ", expected 0 or a positive multiple of 32");
  }
  if (activation_clamp && !(*activation_clamp > 0.0f)) {
    return fail("activation clamp must be positive when set");
  }
  if (weights.empty()) return fail("weights must be \"synthetic:SEED\" or a file path");
  return Status::Ok();
}

}  // namespace gcmoe::engine
