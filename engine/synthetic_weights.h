// Internal: deterministic weights from a seed ("synthetic:SEED").
//
// Every value is a pure function of (seed, layer, expert, matrix, row, column): a counter-based
// generator (splitmix64's mixer over the packed coordinates), so any expert is generated alone,
// in any order, on any thread, with the same bits. Value = z / sqrt(fan_in) * 2^u_row where z is
// approximately standard normal (Irwin-Hall sum of four uniforms, rescaled: integer and exact
// float64 arithmetic only) and u_row is uniform in [-1, 1] per row, so that the UE8M0 block
// scales differ between rows as they do in trained weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/weight_layout.h"
#include "engine/weights.h"

namespace gcmoe::engine {

class SyntheticWeightSource final : public WeightSource {
 public:
  SyntheticWeightSource(ModelSpec spec, uint64_t seed) : spec_(std::move(spec)), seed_(seed) {}

  const ModelSpec& spec() const override { return spec_; }
  std::string Describe() const override { return "synthetic:" + std::to_string(seed_); }

  Result<ExpertWeights> LoadExpert(int layer, int expert) const override;
  Result<SharedExpertWeights> LoadShared(int layer) const override;
  Result<DenseExpertWeights> LoadExpertDense(int layer, int expert) const override;
  Result<DenseExpertWeights> LoadSharedDense(int layer) const override;
  // Synthetic values are finite by construction; only the indices are checked.
  Status CheckExperts(const std::vector<int>& layers,
                      const std::vector<int>& experts) const override;

  // Fills the [rows, cols] matrix `m` of one expert (expert 0 for the shared expert).
  void Generate(const WeightMatrix& m, int layer, int expert, float* out) const;

 private:
  ModelSpec spec_;
  uint64_t seed_;
};

}  // namespace gcmoe::engine
