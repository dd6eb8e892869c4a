// The tiny model of the engine tests and helpers to put files in the test's temp directory.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "engine/model_spec.h"

namespace gcmoe::engine::testing_util {

// H=256, I=128, E=16, top-4, shared I_s=128, alpha 1.0, clamp 10.0.
inline ModelSpec TinyModel(const std::string& weights = "synthetic:7", int layers = 1) {
  ModelSpec spec;
  spec.hidden = 256;
  spec.intermediate = 128;
  spec.num_experts = 16;
  spec.top_k = 4;
  spec.num_layers = layers;
  spec.shared_intermediate = 128;
  spec.activation_alpha = 1.0f;
  spec.activation_clamp = 10.0f;
  spec.weights = weights;
  return spec;
}

// A per-process path in gtest's temp directory, so parallel ctest runs do not collide.
inline std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "gcmoe_" + std::to_string(getpid()) + "_" + name;
}

}  // namespace gcmoe::engine::testing_util
