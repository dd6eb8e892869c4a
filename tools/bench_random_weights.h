// A WeightSource of random quantized codes, for `gcmoe bench layer` and the GPU tests: any
// expert is generated independently from (seed, layer, expert) in milliseconds, where the
// synthetic source would draw and quantize full-precision weights first. No full-precision
// weights stand behind the codes (LoadExpertDense answers NotFound, like a pre-quantized file).
//
// The codes cover every E2M1 nibble and a band of E4M3 exponents; block scales vary by a
// factor of 2 around 1/(rms code * sqrt(K)) per block, so activations keep unit scale through
// the layer and every block carries its own scale. With `biases` every routed expert also has
// b1 and b2 (as gpt-oss), BF16 values uniform in [-1, 1].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/weights.h"

namespace gcmoe::tools {

class RandomCodeWeightSource final : public engine::WeightSource {
 public:
  RandomCodeWeightSource(const engine::ModelSpec& spec, uint64_t seed, bool biases = false);

  const engine::ModelSpec& spec() const override { return spec_; }
  std::string Describe() const override;
  Result<engine::ExpertWeights> LoadExpert(int layer, int expert) const override;
  Result<engine::SharedExpertWeights> LoadShared(int layer) const override;
  Result<engine::DenseExpertWeights> LoadExpertDense(int layer, int expert) const override;
  Result<engine::DenseExpertWeights> LoadSharedDense(int layer) const override;
  Status CheckExperts(const std::vector<int>& layers,
                      const std::vector<int>& experts) const override;

  // Bytes of one routed expert's codes and scales (W1 and W2), and of the shared expert's.
  static int64_t RoutedExpertBytes(const engine::ModelSpec& spec);
  static int64_t SharedExpertBytes(const engine::ModelSpec& spec);

 private:
  engine::ModelSpec spec_;
  uint64_t seed_;
  bool biases_;
};

}  // namespace gcmoe::tools

// The GPU tests (tests/kernels) still name it from when it lived in server/.
namespace gcmoe::server {
using tools::RandomCodeWeightSource;
}  // namespace gcmoe::server
